"""FastAP (Cakir, He, Xia, Kulis, Sclaroff, CVPR 2019) as a PML loss."""

from __future__ import annotations

from pytorch_metric_learning.distances import LpDistance

from ..functional.histogram.ap_losses import masked_ap_losses
from ..functional.histogram.reference import histogram_ap
from ..functional.validation import check_int
from .histogram_ap_base import MAX_NUM_BINS, HistogramAPLoss


class FastAPLoss(HistogramAPLoss):
    """FastAP: ``1 - AP`` with AP approximated from soft histograms of squared distances.

    Squared Euclidean distances of L2-normalized embeddings, ``d2 = 2 - 2 cos`` in ``[0, 4]``, are
    histogrammed with ``num_bins + 1`` centres ``linspace(0, 4, num_bins + 1)`` and a triangular
    kernel of width ``4 / num_bins`` (the authors' and PML's convention; values outside ``[0, 4]``
    from round-off saturate into the end bins); ``FastAP_i = (1/N+_i) sum_l h+_l H+_l / H_l``
    (FastAP eq. 14). Values equal PML's ``FastAPLoss`` on batches where PML is defined (see
    :doc:`/migrating` for the differences: ``indices_tuple`` restricts lists here, ``ref_emb`` is
    supported). Drop-in signature: PML's ``FastAPLoss(num_bins=10, **kwargs)``; float16/bfloat16
    embeddings give the loss in their dtype, as PML's (computed in float32). With a memory bank
    use :class:`pml_rank_plugins.losses.CrossBatchMemory`: PML's own refuses this class by name
    ("CrossBatchMemory not supported for FastAPLoss"); likewise
    :class:`pml_rank_plugins.losses.SelfSupervisedLoss` instead of PML's.

    A query whose list has positives but no negative -- e.g. when a miner mined it none -- has
    ``FastAP_i = 1`` exactly (eq. 14 with ``H_l = H+_l``: every prefix of its list is all
    positives): loss 0, counted among the valid queries and in the mean. A miner that mines no
    negative at all therefore gives loss 0 with zero gradient; PML's ``FastAPLoss`` ranks the
    full batch whatever the miner and uses the mined tuples only as per-query weights (e.g. 0.86
    where this loss gives 0). Queries with no positive are excluded (``num_skipped_queries``).

    Cost: O(N M d + N M) time, O(threads * chunk * M) floats (one chunk buffer per CPU thread)
    + N M bytes of working memory, independent of ``num_bins``, plus the
    ``(N, 2, num_bins + 1)`` histograms (PML's ``FastAPLoss``: O(num_bins N^2) memory). See
    :class:`~pml_rank_plugins.losses.histogram_ap_base.HistogramAPLoss` for the PML contract.

    Args:
        num_bins: number of bin spacings ``L`` (1 to ``MAX_NUM_BINS`` = 4096); the default 10 is the
            paper's.
        chunk_size, backend, check_values: as
            :class:`~pml_rank_plugins.losses.histogram_ap_base.HistogramAPLoss`.
        distance: must be PML's ``LpDistance(p=2, power=2, normalize_embeddings=True)`` (default).
    """

    def __init__(
        self,
        num_bins: int = 10,
        chunk_size: int | None = None,
        backend: str | None = None,
        check_values: bool | None = None,
        **kwargs,
    ):
        num_bins = check_int(num_bins, "num_bins", minimum=1, maximum=MAX_NUM_BINS)
        self.num_bins = self.num_intervals = num_bins
        super().__init__(
            chunk_size=chunk_size, backend=backend, check_values=check_values, **kwargs
        )
        self.add_to_recordable_attributes(list_of_names=["num_bins"], is_stat=False)

    def get_default_distance(self):
        return LpDistance(p=2, power=2, normalize_embeddings=True)

    def _check_distance(self) -> None:
        d = self.distance
        if not (type(d) is LpDistance and d.p == 2 and d.power == 2 and d.normalize_embeddings):
            raise ValueError(
                "FastAPLoss histograms squared Euclidean distances of L2-normalized embeddings in "
                "[0, 4]; it needs distance=LpDistance(p=2, power=2, normalize_embeddings=True), "
                f"got {d!r} with p={getattr(d, 'p', None)}, power={getattr(d, 'power', None)}, "
                f"normalize_embeddings={getattr(d, 'normalize_embeddings', None)}"
            )

    def _bin_transform(self) -> tuple[float, float]:
        # d2 = 2 - 2 s, in units of delta = 4 / L: u = (2 - 2 s) L / 4.
        return self.num_bins / 2, -self.num_bins / 2

    def _average_precision(self, h_pos, h_neg, num_pos):
        return histogram_ap(h_pos, h_neg, num_pos)

    def _masked_losses(self, hist, num_pos, ranked, weights=None, mean_over=None):
        return masked_ap_losses(hist, num_pos, ranked, False, weights, mean_over)
