"""The histogram-AP losses' ``compute_loss`` on the ``gpu`` / ``triton`` backends: no host sync.

The CPU path (:meth:`HistogramAPLoss._compute_loss`) picks the valid and ranked queries with
``nonzero`` and runs the kernel on the ranked ones only; every such selection makes a GPU wait
for the host. Here every query goes through the kernel and the selection is a mask:

* ``valid = num_pos > 0`` (AP defined), ``ranked = valid & num_neg > 0`` (a list to order);
  ``loss_i = where(ranked_i, w_i (1 - AP_i), 0)``: exactly 0, with zero gradient, for the
  others (a list of positives only has AP 1; an invalid query has no AP).
* ``num_valid_queries`` and ``num_skipped_queries`` are 0-dim int64 tensors on the embeddings'
  device (a Python ``int`` would need a sync); ``int(loss.num_valid_queries)`` reads one.
* Reduction: with PML's default ``MeanReducer`` the mean over the valid queries is taken here,
  ``sum(loss_i) / max(num_valid, 1)``, and handed over as ``"already_reduced"`` (the same value
  as ``MeanReducer`` over the valid queries' ``"element"`` losses, summed in another order). Any
  other reducer gets the valid queries' ``"element"`` losses and indices as on the CPU path,
  which takes one ``nonzero`` (one host sync per call).

Values that only the host could check (NaN/inf embeddings, ``indices_tuple`` index ranges, a pair
mined both positive and negative) are checked only with ``check_values=True`` on the loss
(:func:`pml_rank_plugins.functional.backend.checks_values`); shapes, dtypes and devices always.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.reducers import MeanReducer
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.histogram import dispatch
from ..functional.histogram.cpu import pair_categories
from ..functional.histogram.gpu import LabelPairs
from ..functional.histogram.sync_free import (
    label_counts,
    mined_categories,
    prepare_unit_embeddings,
)
from ..functional.validation import validate_indices_tuple
from ..utils.loss_and_miner_utils import check_loss_labels, pair_masks


def sync_free_loss(
    loss, embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index, backend, check_values
) -> dict:
    """PML loss dict of the histogram-AP ``loss`` (a ``HistogramAPLoss``) computed on ``backend``
    (``"gpu"`` or ``"triton"``) without a host sync (see the module docstring). O(N M d) time,
    the kernel's chunk buffers of memory (+ N M bytes of categories with ``indices_tuple``)."""
    check_loss_labels(labels, ref_labels)
    queries, refs, is_self = prepare_unit_embeddings(embeddings, ref_emb, check_values)
    n, m = len(queries), len(refs)
    validate_indices_tuple(indices_tuple, n, m, check_values=check_values)
    if n == 0 or m == 0:
        loss.num_valid_queries = torch.zeros((), dtype=torch.long, device=queries.device)
        loss.num_skipped_queries = torch.full((), n, dtype=torch.long, device=queries.device)
        return loss._connected_zero(queries, refs)
    with torch.no_grad():
        categories, num_pos, valid, ranked = _categories(
            labels, ref_labels, indices_tuple, is_self, self_index, check_values
        )
        num_valid = valid.sum()
    loss.num_valid_queries, loss.num_skipped_queries = num_valid, n - num_valid
    offset, scale = loss._bin_transform()
    hist = dispatch.pair_histograms(
        queries,
        refs,
        categories,
        offset,
        scale,
        loss.num_intervals,
        loss.chunk_size,
        backend=backend,
    )
    weights = loss._masked_query_weights(labels, valid)
    if type(loss.reducer) is MeanReducer:
        mean = loss._masked_losses(hist, num_pos, ranked, weights, num_valid)
        return {"loss": {"losses": mean, "indices": None, "reduction_type": "already_reduced"}}
    losses = loss._masked_losses(hist, num_pos, ranked, weights)
    # Another reducer needs the valid queries' own losses: one nonzero (one host sync).
    valid_rows = torch.nonzero(valid).squeeze(1)
    return {
        "loss": {
            "losses": losses[valid_rows],
            "indices": valid_rows,
            "reduction_type": "element",
        }
    }


def _categories(labels, ref_labels, indices_tuple, is_self, self_index, check_values):
    """``(categories, num_pos, valid, ranked)``: a ``LabelPairs`` source without a miner (counts
    by binary search, O(N + M)), else the mined pairs' ``(N, M)`` int8 tensor. With
    ``check_values`` the mined pairs go through the CPU path's ``pair_masks`` /
    ``pair_categories`` (which reject a pair mined both ways)."""
    if indices_tuple is None:
        exclude_own = is_self or self_index is not None
        num_pos, valid, ranked = label_counts(labels, ref_labels, exclude_own)
        categories = LabelPairs(labels, ref_labels, self_index, diagonal=is_self)
        return categories, num_pos, valid, ranked
    if check_values:
        pos_mask, neg_mask = pair_masks(labels, ref_labels, indices_tuple, exclude_self=is_self)
        categories, num_pos, num_neg = (
            pair_categories(pos_mask, neg_mask),
            pos_mask.sum(1),
            neg_mask.sum(1),
        )
    else:
        pairs = lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
        exclude_diagonal = is_self and len(labels) == len(ref_labels)
        categories, num_pos, num_neg = mined_categories(
            pairs, len(labels), len(ref_labels), exclude_diagonal
        )
    valid = num_pos > 0
    return categories, num_pos, valid, valid & (num_neg > 0)
