"""RLL's non-trivial pair mining and loss-based negative weighting as a PML miner."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.miners import BaseMiner
from pytorch_metric_learning.utils import common_functions as c_f

from ..functional.backend import check_backend_options, checks_values, resolve_backend
from ..functional.chunk_threads import glue_elements, one_torch_thread
from ..functional.ranked_list import (
    check_rll_params,
    default_alpha,
    mine_non_trivial,
    negative_weights,
)
from ..functional.ranked_list.cpu import chunked_ranked_list_mining
from ..functional.validation import (
    check_label_values,
    check_labels,
    check_ref_labels_pairing,
    clamp_self_index,
    flag_non_finite,
    prepare_embeddings,
)
from ..utils.loss_and_miner_utils import (
    WeightedPairs,
    check_chunk_size,
    check_self_index,
    distance_matrix,
    euclidean_embeddings,
    pair_masks,
    ranked_list_categories,
)
from ..utils.ranked_list_backends import sync_free_mine


class RankedListMiner(BaseMiner):
    """Mine Ranked List Loss's non-trivial pairs (Wang et al., CVPR 2019, sec. 3).

    For each query ``i`` (embeddings) and reference item ``j`` (``ref_emb``, default the batch
    itself without self-pairs), with ``d`` the miner's distance (default ``LpDistance`` on
    L2-normalized embeddings):

    * positive pairs ``(a1, p)``: same label and ``d > alpha - margin``;
    * negative pairs ``(a2, n)``: different label and ``d < alpha``;
    * ``.weights``: RLL's negative weights ``exp(Tn (alpha - d))`` normalized over each anchor's
      mined negatives (eqs. 9, 12), computed as a masked softmax (no overflow for any ``Tn``).

    Returns a :class:`WeightedPairs`, a standard PML pair tuple ``(a1, p, a2, n)``: any PML pair
    loss accepts it and ignores ``.weights``; :class:`pml_rank_plugins.losses.RankedListLoss` uses
    the weights (instead of its own ``Tn``) when present. Pairs are sorted by anchor. ``weights``
    is float32 for float16/bfloat16 embeddings and under ``torch.autocast``. An empty batch or
    empty ``ref_emb`` gives empty tuples.

    Cost: with the default ``LpDistance(p=2, power=1)`` mining runs chunk by chunk
    (``pml_rank_plugins.functional.ranked_list.cpu.chunked_ranked_list_mining``,
    ``chunk_size`` query rows at a time): O(N M d) time, O(chunk_size x M) working memory plus
    the output; any other distance object is called as is (O(N M) memory).

    Stats (``collect_stats``): ``num_pos_pairs``, ``num_neg_pairs`` (set by PML) and
    ``num_anchors_nothing_mined`` (queries with no non-trivial pair at all; a 0-dim tensor on the
    ``gpu`` / ``triton`` backends).

    Query weighting: the miner has no ``query_weighting`` option because it weights pairs
    within a query, and those weights (eqs. 9, 12, normalized per anchor) are the same under
    the paper's mean over queries (eq. 14) and the authors' Caffe layer's weighting of query
    ``i`` by ``0.5 W_i / sum_k W_k``. That query weight is a property of the batch loss:
    ``RankedListLoss(query_weighting="weight_share")`` computes ``W_i`` itself, from its own
    ``Tn`` / ``Tp`` over the mined pairs, also when it receives this miner's ``.weights`` (with
    the same ``margin`` and ``Tn`` the result equals the loss without the miner). The normalized
    ``.weights`` could not carry ``W_i`` anyway: each anchor's sum to 1.

    Args:
        margin, Tn: as :class:`~pml_rank_plugins.losses.RankedListLoss`, in the same (PML's)
            positional order, so ``RankedListMiner(0.4, 10)`` mines for ``RankedListLoss(0.4,
            10)``.
        alpha: keyword-only; ``None`` (default): ``1 + margin / 2``, as the loss.
        chunk_size: query rows per chunk (``None``: automatic).
        backend: as :class:`~pml_rank_plugins.losses.RankedListLoss` (``gpu`` / ``triton``:
            ``pml_rank_plugins.functional.ranked_list.gpu_mining``; the fused Triton kernel is
            the loss's: index lists need the mined masks, which that path builds). A miner
            returns index tuples whose lengths depend on the data, so no backend can mine
            without reading back from the device: the ``gpu`` path does it exactly once per
            call (the pair counts, one device-to-host copy), the ``cpu`` path once per chunk
            and pair kind.
        check_values: as the loss (``self_index`` ranges, finite embeddings); float label
            values (NaN, inf, fractions) are checked on every backend, as the losses do.

    ``self_index`` (keyword of ``forward``): ``(N,)`` column of ``ref_emb`` that holds query
    ``i`` itself (same label), left out of its list before mining -- the pairs PML's
    ``remove_self_comparisons`` would remove afterwards, while ``.weights`` stay aligned (a
    query's own column is a positive, never a weighted negative).
    :class:`pml_rank_plugins.losses.CrossBatchMemory` passes the memory slots of the batch (and
    takes its fast path, without a batch x memory pair tuple, only for a miner that accepts
    ``self_index``). The copy is at distance 0 in exact arithmetic, a trivial positive, but the
    computed distance is about 1e-4 (float32; more in half precision: the square root of
    rounding errors near 0), so with a positive boundary ``alpha - margin`` below that the copy
    would be mined as a non-trivial pair of the query with itself; ``self_index`` rules it out.

    Labels must be class ids: bool labels are a ``ValueError``, as in the losses.
    """

    def __init__(
        self,
        margin: float = 0.4,
        Tn: float = 10.0,
        *,
        alpha: float | None = None,
        chunk_size: int | None = None,
        backend: str | None = None,
        check_values: bool | None = None,
        **kwargs,
    ):
        alpha = default_alpha(margin, alpha)
        check_rll_params(alpha, margin, Tn)
        chunk_size = check_chunk_size(chunk_size)
        backend, check_values = check_backend_options(backend, check_values)
        super().__init__(**kwargs)
        self.chunk_size = chunk_size
        self.backend, self.check_values = backend, check_values
        if self.distance.is_inverted:
            raise ValueError("RankedListMiner needs a distance (small = similar), not a similarity")
        self.alpha, self.margin, self.Tn = float(alpha), float(margin), float(Tn)
        self.add_to_recordable_attributes(list_of_names=["alpha", "margin", "Tn"], is_stat=False)
        self.add_to_recordable_attributes(name="num_anchors_nothing_mined", is_stat=True)

    def get_default_distance(self):
        return LpDistance(p=2, power=1, normalize_embeddings=True)

    def forward(
        self, embeddings, labels, ref_emb=None, ref_labels=None, *, self_index=None
    ) -> WeightedPairs:
        """PML's ``BaseMiner.forward``, plus ``self_index``.

        Args:
            embeddings: ``(N, D)`` query embeddings.
            labels: ``(N,)`` query labels.
            ref_emb: ``(M, D)`` reference embeddings (``None``: the batch itself).
            ref_labels: ``(M,)`` reference labels.
            self_index: ``(N,)`` integer tensor, the column of ``ref_emb`` holding each query
                (left out of its list); needs ``ref_emb``. ``None``: none.

        Returns:
            The mined :class:`WeightedPairs`.

        Raises:
            ValueError: missing labels, ``self_index`` without ``ref_emb`` / ``ref_labels``, or a
                malformed ``self_index``.
        """
        if labels is None:  # PML's BaseMiner.forward would fail with an AttributeError
            raise ValueError("RankedListMiner needs labels (and ref_labels with ref_emb)")
        check_labels(labels, "labels")  # before PML's own checks, which assume tensors
        check_labels(ref_labels, "ref_labels")
        check_ref_labels_pairing(ref_emb, ref_labels)  # PML would drop ref_labels silently
        if self_index is None:
            return super().forward(embeddings, labels, ref_emb, ref_labels)
        if ref_emb is None or ref_labels is None:
            raise ValueError(
                "self_index names columns of ref_emb: pass ref_emb and ref_labels with it (the "
                "batch against itself already leaves out its diagonal)"
            )
        # The body of PML 2.9's BaseMiner.forward, with self_index passed on to mine.
        self.reset_stats()
        with torch.no_grad():
            c_f.check_shapes(embeddings, labels)
            labels = c_f.to_device(labels, embeddings)
            ref_emb, ref_labels = c_f.set_ref_emb(embeddings, labels, ref_emb, ref_labels)
            mining_output = self.mine(
                embeddings, labels, ref_emb, ref_labels, self_index=self_index
            )
        self.output_assertion(mining_output)
        return mining_output

    def mine(self, embeddings, labels, ref_emb, ref_labels, self_index=None) -> WeightedPairs:
        if labels is None or ref_labels is None:
            raise ValueError("RankedListMiner needs labels (and ref_labels with ref_emb)")
        check_labels(labels, "labels")
        check_labels(ref_labels, "ref_labels")
        backend = resolve_backend(embeddings.device, self.backend, dtype=embeddings.dtype)
        values = checks_values(backend, self.check_values)
        # NaN / inf / fractional labels, on every backend as the losses do (check_loss_labels):
        # integer labels are not read at all, float ones once (this miner reads counts back
        # anyway, so no sync-free path is lost).
        check_label_values(labels, "labels")
        check_label_values(ref_labels, "ref_labels")
        bad = None
        if self_index is not None:
            self_index = check_self_index(self_index, labels, ref_labels, check_values=values)
            if not values:  # out of range or another label: NaN weights, no sync (the losses')
                self_index, bad = clamp_self_index(self_index, labels, ref_labels)
        # Under torch.autocast the distance product would run in low precision: mine in float32.
        # On one torch thread around the chunks (see chunk_threads.one_torch_thread).
        device, glue = embeddings.device, glue_elements(embeddings, ref_emb)
        # (A no-op while torch.compile traces, see chunk_threads: the gpu path's one graph break
        # is then the pair counts' read, host_counts.)
        with torch.autocast(device.type, enabled=False), one_torch_thread(device, glue):
            if backend != "cpu":
                pairs = sync_free_mine(
                    self, embeddings, labels, ref_emb, ref_labels, self_index, values
                )
                return WeightedPairs(*pairs, weights=flag_non_finite(pairs.weights, bad))
            return self._mine(embeddings, labels, ref_emb, ref_labels, self_index)

    def _mine(self, embeddings, labels, ref_emb, ref_labels, self_index=None) -> WeightedPairs:
        emb, ref, is_self = prepare_embeddings(embeddings, ref_emb)
        if len(emb) == 0 or len(ref) == 0:  # nothing to rank: empty tuples
            empty = torch.zeros(0, dtype=torch.long, device=emb.device)
            if self.collect_stats:
                self.num_anchors_nothing_mined = len(emb)
            return WeightedPairs(empty, empty, empty, empty, weights=emb.new_zeros(0))
        chunkable = euclidean_embeddings(self.distance, emb, ref, is_self, False)
        if chunkable is not None:
            categories = ranked_list_categories(labels, ref_labels, None, is_self, self_index)
            a1, p, a2, n, weights = chunked_ranked_list_mining(
                *chunkable, categories, self.alpha, self.margin, self.Tn, self.chunk_size
            )
        else:  # any other distance object: its (N, M) matrix
            dist = distance_matrix(self.distance, emb, ref)
            pos_mask, neg_mask = pair_masks(
                labels, ref_labels, exclude_self=is_self, self_index=self_index
            )
            pos, neg = mine_non_trivial(dist, pos_mask, neg_mask, self.alpha, self.margin)
            a1, p = pos.nonzero(as_tuple=True)
            a2, n = neg.nonzero(as_tuple=True)
            weights = negative_weights(dist, neg, self.Tn)[a2, n]
        if self.collect_stats:
            mined = torch.zeros(len(emb), dtype=torch.bool, device=emb.device)
            mined[a1] = True
            mined[a2] = True
            self.num_anchors_nothing_mined = int((~mined).sum().item())
        return WeightedPairs(a1, p, a2, n, weights=weights)
