"""Shared PML plumbing of the histogram-AP losses (FastAP, mAP_Q / mAP_T)."""

from __future__ import annotations

import torch
from pytorch_metric_learning.losses import BaseMetricLossFunction

from ..functional.backend import check_backend_options, checks_values
from ..functional.chunk_threads import glue_elements, one_thread_apply, one_torch_thread
from ..functional.histogram.cpu import LabelCategories, pair_categories, pair_histograms
from ..functional.sync_free_inputs import autocast_off
from ..functional.validation import (
    check_int,
    prepare_embeddings,
    validate_indices_tuple,
)
from ..utils.loss_and_miner_utils import check_loss_labels, pair_masks
from .histogram_ap_sync_free import sync_free_loss
from .loss_output import call_backend, finish_loss
from .self_index import SelfIndexForward

# Upper bound on num_bins: the histograms take (N, 2, num_bins + 1) floats, and published settings
# stay below 100 (FastAP 10-20, listwise AP 20-25); 1e9 bins is a typo, refused with the key named.
MAX_NUM_BINS = 4096


class HistogramAPLoss(SelfIndexForward, BaseMetricLossFunction):
    """Loss ``1 - AP_i`` per query, AP computed from soft histograms of pairwise scores.

    Subclasses define the histogrammed value (``_bin_transform``: offset and scale mapping the dot
    product of normalized embeddings to bin units), the number of bin spacings
    (``num_intervals``), the AP formula (``_average_precision``) and validate ``self.distance``.

    Per query ``i`` the ranked list holds the reference items ``j`` with ``pos[i, j]`` or
    ``neg[i, j]`` (``pml_rank_plugins.utils.loss_and_miner_utils.pair_masks``: same label /
    other label without ``indices_tuple``, the self pair removed when ranking the batch against
    itself, or the column ``self_index[i]`` of ``ref_emb`` that holds the query (see
    :class:`~pml_rank_plugins.losses.self_index.SelfIndexForward`); with ``indices_tuple`` only
    the mined pairs of ``i``).

    Which queries count, from the papers' definition of the AP of a query's ranked list: a query
    with no positive in its list has no AP (0/0): it is excluded and counted in
    ``num_skipped_queries``. A query with positives but no negative -- a one-class batch, a
    reference set without its other classes, or a miner that mined it no negative -- has AP
    exactly 1 (every prefix of its list is all positives; FastAP eq. 14 with ``H_l = H+_l``,
    AP_Q eq. 9-11 and mAP_T eq. 13 with ``P_m = 1``): it is valid, with loss 0 (no gradient:
    nothing to reorder), counted in ``num_valid_queries`` and in the mean. (PML's ``FastAPLoss``
    gives AP 1 to such queries too, on full lists; with a miner it ranks the full batch and uses
    the mined tuples only as per-query weights, so a miner that mines no negative still gets
    PML's loss of the full lists, e.g. 0.86 where this loss is 0.)
    Output: ``"element"`` losses ``w_i (1 - AP_i)`` for the valid queries (``w_i = 1`` unless
    class balancing is on), so the default ``MeanReducer`` gives ``1 - mean AP``. With no query
    to rank -- no valid query (in particular an empty batch or an empty ``ref_emb``, where every
    query counts as skipped) or only lists of positives -- the loss is a zero connected to the
    graph: ``backward()`` works and gives zero gradients.

    float16/bfloat16 embeddings are computed in float32; the loss is returned in float32 under
    ``torch.autocast`` and in the embeddings' dtype outside it (as PML's losses return it). ``chunk_size`` bounds memory (query rows per chunk; default:
    256K scores or 128 rows, whichever is more, up to 4M scores).

    Backends (``backend=`` keyword, ``use_backend`` context, ``$PML_RANK_BACKEND``; see
    ``pml_rank_plugins.functional.backend``): ``cpu`` runs ``_compute_loss`` with the
    CPU kernel; ``gpu`` / ``triton`` run ``losses.histogram_ap_sync_free.sync_free_loss`` (no host
    sync: every query through the kernel, masked; ``num_valid_queries`` /
    ``num_skipped_queries`` are then 0-dim tensors; value checks only with
    ``check_values=True``). Both disable ``torch.autocast`` and compute in float32.

    float16 gradient range: the gradient is computed in float32 and cast back, so with float16
    embeddings an entry above 65504 becomes ``inf`` (never NaN; the loss stays finite), which
    ``torch.amp.GradScaler`` handles. Entries grow roughly like ``num_bins / (N ||x||)``:
    measured at ``N = 32``, ``||x|| ~ 1``, the largest is about 0.04 at the default ``num_bins``
    and about 1e4 at ``num_bins = 1e7`` (the histograms, ``O(N num_bins)``, run out of memory
    before float16 does); rows of norm below about ``1e-6`` or a GradScaler scale above
    ``65504 / max|grad|`` overflow. The loss itself is float16 then, so a loss scale above 65504
    overflows its own gradient (GradScaler's default first scale, ``2**16``): the embedding
    gradient is then non-finite (NaN), which GradScaler treats as any overflow -- it skips that
    step and halves the scale (measured; PML's float16 ``FastAPLoss`` does the same).

    Args:
        chunk_size: query rows per chunk (``None``: automatic).
        backend: ``"cpu"``, ``"gpu"``, ``"triton"``, ``"auto"`` or ``None`` (the
            ``use_backend`` context, else ``$PML_RANK_BACKEND``, else ``auto``: ``cpu`` on the
            CPU, ``gpu`` elsewhere); see :doc:`/performance` (Backends).
        check_values: read values back to check them (NaN/inf embeddings, index ranges):
            ``None`` is on for the ``cpu`` backend, off for ``gpu`` / ``triton`` (one host sync
            each per call).
        **kwargs: PML's ``BaseMetricLossFunction`` keywords (``distance``, ``reducer``, ...).
    """

    def __init__(
        self,
        chunk_size: int | None = None,
        backend: str | None = None,
        check_values: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.chunk_size = None if chunk_size is None else check_int(chunk_size, "chunk_size", 1)
        self.backend, self.check_values = check_backend_options(backend, check_values)
        self._check_distance()
        self.add_to_recordable_attributes(
            list_of_names=["num_valid_queries", "num_skipped_queries"], is_stat=True
        )

    # -- subclass interface ---------------------------------------------------------------------
    num_intervals: int

    def _check_distance(self) -> None:
        raise NotImplementedError

    def _bin_transform(self) -> tuple[float, float]:
        raise NotImplementedError

    def _average_precision(self, h_pos, h_neg, num_pos) -> torch.Tensor:
        raise NotImplementedError

    def _query_weights(self, labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def _masked_losses(self, hist, num_pos, ranked, weights=None, mean_over=None):
        """``(N,)`` ``where(ranked, weights (1 - AP), 0)`` of all queries, or with ``mean_over``
        (a 0-dim count) their sum over ``max(mean_over, 1)`` (the ``gpu`` / ``triton`` path).
        This default differentiates ``_average_precision`` with autograd; FastAP and mAP_Q / T
        override it with the closed-form backward of ``functional.histogram.ap_losses``."""
        ap = self._average_precision(hist[:, 0], hist[:, 1], num_pos.to(hist.dtype))
        losses = torch.where(ranked, 1 - ap, 0)
        losses = losses if weights is None else losses * weights.to(losses.dtype)
        return losses if mean_over is None else losses.sum() / mean_over.clamp_min(1)

    def _masked_query_weights(self, labels: torch.Tensor, valid: torch.Tensor):
        """``(N,)`` weights of all queries given the ``valid`` mask, without a host sync (the
        ``gpu`` / ``triton`` path); ``None``: unweighted."""
        return None

    # -- PML --------------------------------------------------------------------------------------
    def forward(
        self,
        embeddings,
        labels=None,
        indices_tuple=None,
        ref_emb=None,
        ref_labels=None,
        *,
        self_index=None,
    ):
        """PML's ``forward`` (with ``self_index``: :class:`~.self_index.SelfIndexForward`).

        float16/bfloat16 embeddings are computed in float32, reducer included. The loss is
        returned in float32 under ``torch.autocast`` (as PML's losses), else in the embeddings'
        dtype (``loss_output.loss_dtype``); the cast is differentiable, and the gradient
        reaching the embeddings keeps their dtype.
        """
        loss = super().forward(
            embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index=self_index
        )
        return finish_loss(loss, embeddings, self)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index=None):
        device = embeddings.device
        backend = call_backend(device, self.backend, embeddings.dtype)
        # Under torch.autocast the products would run in bfloat16/float16: everything here is
        # computed in float32 (or the embeddings' float64) instead.
        if backend != "cpu":
            check = checks_values(backend, self.check_values)
            with autocast_off(device.type):  # (no context to enter when autocast is off)
                return sync_free_loss(
                    self,
                    embeddings,
                    labels,
                    indices_tuple,
                    ref_emb,
                    ref_labels,
                    self_index,
                    backend,
                    check,
                )
        with torch.autocast(device.type, enabled=False):
            # The glue around the kernel on one torch thread (chunk_threads.one_torch_thread).
            glue = glue_elements(embeddings, ref_emb, dense_pairs=indices_tuple is not None)
            with one_torch_thread(device, glue):
                return self._compute_loss(
                    embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index
                )

    def _compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index):
        check_loss_labels(labels, ref_labels)
        # The distance is checked to be an L2-normalizing one; normalize here, overflow-safe.
        queries, refs, is_self = prepare_embeddings(embeddings, ref_emb, normalize=True)
        # Before the empty-input shortcut, so a malformed or out-of-range indices_tuple is an
        # error however many rows there are (pair_masks checks it again on the main path).
        validate_indices_tuple(indices_tuple, len(queries), len(refs))
        dtype = queries.dtype
        if len(queries) == 0 or len(refs) == 0:
            # Empty batch or reference set: no ranked list, every query skipped (policy shared
            # with RankedListLoss).
            self.num_valid_queries, self.num_skipped_queries = 0, len(queries)
            return self._connected_zero(queries, refs)
        with torch.no_grad():
            categories, num_pos, num_neg = self._list_categories(
                labels, ref_labels, indices_tuple, is_self or self_index is not None
            )
            # AP is defined for every query with a positive. A list of positives only has AP 1
            # (FastAP eq. 14: H_l = H+_l; AP_Q eq. 9-11 and mAP_T eq. 13: P_m = 1): loss 0,
            # exactly, counted in the mean without running the kernel.
            valid = num_pos > 0
            ranked = valid & (num_neg > 0)
        self.num_valid_queries = int(valid.sum())
        self.num_skipped_queries = len(valid) - self.num_valid_queries
        if not bool(ranked.any()):  # no valid query, or only lists of positives (AP 1)
            return self._connected_zero(queries, refs)
        valid_rows = torch.nonzero(valid).squeeze(1)
        rows = torch.nonzero(ranked).squeeze(1)
        # Where the kernel's losses go among the valid queries' (the others stay 0).
        slots = torch.nonzero(ranked[valid]).squeeze(1) if len(rows) < len(valid_rows) else None
        if isinstance(categories, torch.Tensor):
            categories = categories[rows]
        else:
            self_columns = rows if is_self else None
            if self_index is not None:
                self_columns = self_index[rows]
            categories = LabelCategories(labels[rows], ref_labels, self_columns)
        offset, scale = self._bin_transform()
        if len(rows) < len(queries):  # (no index when every query is ranked: same values)
            queries = one_thread_apply(lambda q: q[rows], queries)
        hist = pair_histograms(
            queries, refs, categories, offset, scale, self.num_intervals, self.chunk_size
        )
        num_pos = num_pos[rows].to(dtype)
        weights = self._query_weights(labels[valid_rows])  # over all valid queries
        if weights is not None and slots is not None:
            weights = weights[slots]

        def list_losses(hist: torch.Tensor) -> torch.Tensor:
            losses = 1 - self._average_precision(hist[:, 0], hist[:, 1], num_pos)
            losses = losses if weights is None else losses * weights.to(dtype)
            if slots is None:
                return losses
            return losses.new_zeros(len(valid_rows)).index_copy(0, slots, losses)

        losses = one_thread_apply(list_losses, hist)
        return {"loss": {"losses": losses, "indices": valid_rows, "reduction_type": "element"}}

    @staticmethod
    def _connected_zero(queries: torch.Tensor, refs: torch.Tensor) -> dict:
        """A zero loss that depends on both inputs, so ``backward()`` works and gives zero
        gradients (not ``None``) to the embeddings and ``ref_emb``; the inputs are finite
        (checked), so ``0 * sum`` is exactly 0."""
        zero = queries.sum() * 0 + refs.sum() * 0
        return {"loss": {"losses": zero, "indices": None, "reduction_type": "already_reduced"}}

    @staticmethod
    def _list_categories(labels, ref_labels, indices_tuple, is_self):
        """Per-pair categories (dense int8 with a miner, else ``None``: derived per chunk from the
        labels) and per-query positive / negative counts. Without a miner this is O(N + M).
        ``is_self``: each query has one same-label column of its own (the diagonal, or its
        ``self_index``), not counted as a positive; with ``indices_tuple`` it means the
        diagonal."""
        if indices_tuple is not None:
            pos_mask, neg_mask = pair_masks(labels, ref_labels, indices_tuple, exclude_self=is_self)
            return pair_categories(pos_mask, neg_mask), pos_mask.sum(1), neg_mask.sum(1)
        classes, ref_counts = torch.unique(ref_labels, return_counts=True)
        slot = torch.searchsorted(classes, labels.contiguous()).clamp_(max=len(classes) - 1)
        same = torch.where(classes[slot] == labels, ref_counts[slot], 0)
        num_pos = same - 1 if is_self else same
        return None, num_pos, len(ref_labels) - same
