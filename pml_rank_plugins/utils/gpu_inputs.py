"""The PML side of the ``gpu`` / ``triton`` backends of the Ranked List loss and miner: distance
inputs, pair sources and the miner's weights, with no host synchronisation.

Counterparts of :func:`~pml_rank_plugins.utils.loss_and_miner_utils.euclidean_embeddings`,
:func:`~pml_rank_plugins.utils.loss_and_miner_utils.distance_matrix` and
:func:`~pml_rank_plugins.utils.loss_and_miner_utils.ranked_list_categories` that normalize with
:func:`pml_rank_plugins.functional.sync_free_inputs.normalize_rows` (same values, no
``bool(any())``) and build candidates by comparing labels (no ``torch.unique``). A PML distance
object with ``collect_stats`` on still reads its statistics back (PML's own ``.item()`` calls).
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import BaseDistance, LpDistance
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.ranked_list.gpu_steps import (
    DensePairs,
    DenseWeights,
    LabelPairs,
    dense_pair_categories,
)
from ..functional.sync_free_inputs import normalize_rows
from ..functional.validation import check_finite


def euclidean_embeddings(
    distance: BaseDistance,
    embeddings: torch.Tensor,
    ref_emb: torch.Tensor,
    is_self: bool,
    gallery_gradient: bool,
    normalize_fn=normalize_rows,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(queries, refs)`` for the Euclidean kernel (PML's plain ``LpDistance(p=2, power=1)``),
    or ``None`` for any other distance; as ``loss_and_miner_utils.euclidean_embeddings``, with
    ``normalize_fn`` (default: the sync-free normalization; the ``cpu`` path of the Ranked List
    loss passes the screened one, same values). O((N + M) D)."""
    if type(distance) is not LpDistance or distance.p != 2 or distance.power != 1:
        return None
    distance.reset_stats()
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    distance.check_shapes(embeddings, gallery)
    normalize = normalize_fn if distance.normalize_embeddings else (lambda rows: rows)
    queries = normalize(embeddings)
    if is_self:
        refs = queries if gallery_gradient else queries.detach()
    else:
        refs = normalize(gallery)
    distance.set_default_stats(embeddings, gallery, queries, refs)
    return queries, refs


def distance_matrix(
    distance: BaseDistance, embeddings: torch.Tensor, ref_emb: torch.Tensor, gallery_gradient: bool
) -> torch.Tensor:
    """``(N, M)`` distances of any PML distance object (``ref_emb`` detached unless
    ``gallery_gradient``); L2-normalizing ``p = 2`` distances get the sync-free normalization
    first (the distance's own ``F.normalize`` then leaves unit rows unchanged). O(N M D)."""
    is_self = ref_emb is embeddings
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    if distance.normalize_embeddings and getattr(distance, "p", None) == 2:
        embeddings = normalize_rows(embeddings)
        gallery = embeddings if is_self else normalize_rows(gallery)
        gallery = gallery if gallery_gradient else gallery.detach()
    return distance(embeddings, gallery)


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


__all__ = ["distance_matrix", "euclidean_embeddings", "pair_source", "pair_weights"]
