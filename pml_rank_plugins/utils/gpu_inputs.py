"""The PML side of the ``gpu`` / ``triton`` backends of the Ranked List loss and miner: pair
sources and the miner's weights, with no host synchronisation.

:func:`pair_source` is the counterpart of
:func:`~pml_rank_plugins.utils.loss_and_miner_utils.ranked_list_categories` that builds
candidates by comparing labels (no ``torch.unique``); :func:`pair_weights` checks a miner's
weights, their values only when asked. The distance inputs are
:func:`~pml_rank_plugins.utils.loss_and_miner_utils.euclidean_embeddings` and
:func:`~pml_rank_plugins.utils.loss_and_miner_utils.distance_matrix` with the sync-free
:func:`pml_rank_plugins.functional.sync_free_inputs.normalize_rows` (same values, no
``bool(any())``); a PML distance object with ``collect_stats`` on still reads its statistics
back (PML's own ``.item()`` calls)."""

from __future__ import annotations

import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.ranked_list.gpu_steps import (
    DensePairs,
    DenseWeights,
    LabelPairs,
    dense_pair_categories,
)
from ..functional.validation import check_finite


def pair_source(
    labels: torch.Tensor,
    ref_labels: torch.Tensor,
    indices_tuple,
    is_self: bool,
    self_index: torch.Tensor | None = None,
) -> LabelPairs | DensePairs:
    """The candidate pairs of the ranked lists: from the labels (nothing N x M stored), or
    ``(N, M)`` int8 categories of the pairs of an ``indices_tuple`` (PML's triplets converted to
    pairs), self pairs ignored. Reads no value."""
    n, m = len(labels), len(ref_labels)
    self_columns = self_index
    if is_self:
        self_columns = torch.arange(n, device=labels.device)
    if indices_tuple is None:
        return LabelPairs(labels, ref_labels, self_columns)
    a1, p, a2, ng = (
        idx.to(labels.device) for idx in lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
    )
    return DensePairs(dense_pair_categories(n, m, a1, p, a2, ng, self_columns))


def pair_weights(indices_tuple, device: torch.device, check_values: bool) -> DenseWeights | None:
    """A miner's ``indices_tuple.weights`` (aligned with ``(a2, n)``) as :class:`DenseWeights`,
    or ``None``. Lengths always checked; finiteness and signs only with ``check_values``."""
    weights = getattr(indices_tuple, "weights", None)
    if weights is None:
        return None
    if len(indices_tuple) != 4:
        raise ValueError("weights can only come with a pair tuple (a1, p, a2, n)")
    a2, n = indices_tuple[2], indices_tuple[3]
    weights = torch.as_tensor(weights, device=device)
    if weights.ndim != 1 or len(weights) != len(a2) or len(n) != len(a2):
        raise ValueError(
            f"mismatched lengths: weights {tuple(weights.shape)} must align with the negative "
            f"pairs (a2, n) of lengths {len(a2)}, {len(n)}"
        )
    if check_values:
        check_finite(weights, "indices_tuple.weights")
        if (weights < 0).any():
            raise ValueError("indices_tuple.weights must be >= 0")
    return DenseWeights(a2.to(device), n.to(device), weights)


__all__ = ["pair_source", "pair_weights"]
