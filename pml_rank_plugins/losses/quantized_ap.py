"""Listwise mAP_Q / mAP_T (Revaud, Almazan, Rezende, de Souza, ICCV 2019) as a PML loss."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import CosineSimilarity

from ..functional.histogram.ap_losses import masked_ap_losses
from ..functional.histogram.reference import histogram_ap, tie_aware_histogram_ap
from ..functional.histogram.sync_free import balanced_query_weights
from ..functional.validation import check_int
from .histogram_ap_base import MAX_NUM_BINS, HistogramAPLoss


class QuantizedAPLoss(HistogramAPLoss):
    """mAP_Q (or tie-aware mAP_T): ``1 - AP`` from quantized cosine similarities.

    Similarities ``s`` in ``[-1, 1]`` are soft-assigned to ``num_bins`` bins with centres
    ``b_m = 1 - (m - 1) delta``, ``delta = 2 / (num_bins - 1)`` (most similar first), triangular
    kernel of half-width ``delta``, end bins saturating (Revaud eq. 7-8).
    ``AP_Q = sum_m P_m dr_m`` (eq. 9-11); with ``tie_aware`` the precision of a bin is the tie-aware
    ``P_m = (1 + c+_m + 2 C+_{m-1}) / (1 + c_m + 2 C_{m-1})`` (eq. 13). A query whose list has
    positives but no negative (e.g. a miner mined it none) has ``P_m = 1`` in both, so AP 1:
    loss 0, counted among the valid queries (and in the class balance); queries with no positive
    are excluded. float16/bfloat16 embeddings give the loss in their dtype (computed in float32).

    ``class_balanced=True`` (Revaud sec. 4.2) weights the valid queries so that every class present
    among them carries the same total weight, with weights averaging 1 (so the loss scale is
    unchanged): ``w_i = V / (K * V_c(i))`` for ``V`` valid queries, ``K`` classes, ``V_c`` valid
    queries of class ``c``.

    Cost as :class:`~pml_rank_plugins.losses.FastAPLoss`: O(N M d + N M) time, O(threads *
    chunk * M) floats + N M bytes of memory plus the ``(N, 2, num_bins)`` histograms. With a
    memory bank use :class:`pml_rank_plugins.losses.CrossBatchMemory` (PML's refuses this class
    by name); likewise :class:`pml_rank_plugins.losses.SelfSupervisedLoss` instead of PML's.

    Args:
        num_bins: number of bins ``M`` (2 to ``MAX_NUM_BINS`` = 4096; paper default 20).
        class_balanced: weight queries so each class counts equally.
        tie_aware: use mAP_T instead of mAP_Q.
        chunk_size, backend, check_values: as
            :class:`~pml_rank_plugins.losses.histogram_ap_base.HistogramAPLoss`.
        distance: must be PML's ``CosineSimilarity()`` (default).
    """

    def __init__(
        self,
        num_bins: int = 20,
        class_balanced: bool = False,
        tie_aware: bool = False,
        chunk_size: int | None = None,
        backend: str | None = None,
        check_values: bool | None = None,
        **kwargs,
    ):
        num_bins = check_int(num_bins, "num_bins", minimum=2, maximum=MAX_NUM_BINS)
        self.num_bins = num_bins
        self.num_intervals = num_bins - 1
        self.class_balanced = bool(class_balanced)
        self.tie_aware = bool(tie_aware)
        super().__init__(
            chunk_size=chunk_size, backend=backend, check_values=check_values, **kwargs
        )
        self.add_to_recordable_attributes(list_of_names=["num_bins"], is_stat=False)

    def get_default_distance(self):
        return CosineSimilarity()

    def _check_distance(self) -> None:
        d = self.distance
        if not (isinstance(d, CosineSimilarity) and d.normalize_embeddings):
            raise ValueError(
                "QuantizedAPLoss quantizes cosine similarities in [-1, 1]; it needs "
                f"distance=CosineSimilarity(), got {d!r}"
            )

    def _bin_transform(self) -> tuple[float, float]:
        # Bin m sits at 1 - m delta (0-based): u = (1 - s) / delta, delta = 2 / (M - 1).
        return self.num_intervals / 2, -self.num_intervals / 2

    def _average_precision(self, h_pos, h_neg, num_pos):
        if self.tie_aware:
            return tie_aware_histogram_ap(h_pos, h_neg, num_pos)
        return histogram_ap(h_pos, h_neg, num_pos)

    def _masked_losses(self, hist, num_pos, ranked, weights=None, mean_over=None):
        return masked_ap_losses(hist, num_pos, ranked, self.tie_aware, weights, mean_over)

    def _query_weights(self, labels: torch.Tensor) -> torch.Tensor | None:
        if not self.class_balanced:
            return None
        _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        return len(labels) / (len(counts) * counts[inverse].double())

    def _masked_query_weights(self, labels: torch.Tensor, valid: torch.Tensor):
        if not self.class_balanced:
            return None
        return balanced_query_weights(labels, valid)
