"""The ``gpu`` / ``triton`` paths of :class:`~pml_rank_plugins.losses.RankedListLoss` and
:class:`~pml_rank_plugins.miners.RankedListMiner` (selected by
:func:`~pml_rank_plugins.functional.backend.resolve_backend`).

Routes, explicit (docs/ranked-list.md, backends):

* loss, ``triton``, the default ``LpDistance(p=2, power=1)`` (normalized or not): the fused
  kernel :func:`pml_rank_plugins.functional.ranked_list.triton_kernel.triton_ranked_list_terms`
  (every option: labels, ``ref_emb``, ``self_index`` / the memory bank, a miner's pairs and
  weights, ``Tn``, ``Tp``, ``query_weighting``, ``gallery_gradient``); float64 embeddings are a
  ``TypeError`` there, as the histogram losses' ``triton`` (use ``gpu`` or ``cpu``);
  ``chunk_size`` does not apply (the kernel tiles);
* loss, ``triton``, any other distance object: its ``(N, M)`` matrix is computed by calling it,
  then the ``gpu`` dense kernel runs on it (no Euclidean structure to fuse);
* loss, ``gpu``: :mod:`pml_rank_plugins.functional.ranked_list.gpu`;
* miner, ``gpu`` and ``triton``: :mod:`pml_rank_plugins.functional.ranked_list.gpu_mining` (a
  miner returns index lists, built from masks by ``nonzero_static``: a fused kernel would still
  write those masks or compact pairs after a counting pass, which is what that path does).

The loss reads no tensor value on the host (forward and backward: zero syncing operators) unless
``check_values`` (:func:`~pml_rank_plugins.functional.backend.checks_values`). The miner returns
index tuples whose sizes depend on the data, so it cannot be sync-free: it reads the mined-pair
counts back once per call (:func:`pml_rank_plugins.functional.ranked_list.gpu_mining.host_counts`)
and nothing else.
"""

from __future__ import annotations

import torch

from ..functional.ranked_list.gpu import gpu_ranked_list_terms, gpu_ranked_list_terms_dense
from ..functional.ranked_list.gpu_mining import gpu_mining_from_dist, gpu_ranked_list_mining
from ..functional.ranked_list.gpu_steps import LabelPairs
from ..functional.ranked_list.triton_kernel import triton_ranked_list_terms
from ..functional.sync_free_inputs import normalize_rows, prepare_embeddings
from ..functional.validation import validate_indices_tuple
from .gpu_inputs import pair_source, pair_weights
from .loss_and_miner_utils import WeightedPairs, distance_matrix, euclidean_embeddings


def sync_free_loss_terms(
    loss,
    embeddings,
    labels,
    indices_tuple,
    ref_emb,
    ref_labels,
    self_index,
    check_values,
    backend: str = "gpu",
):
    """``RankedListLoss``'s terms on the ``gpu`` kernels, or with ``backend="triton"`` the fused
    kernel for the Euclidean distance (module docstring); ``None`` for an empty batch or
    reference set, after setting the query counts. ``loss`` supplies the distance and the
    parameters; ``check_values`` adds the ``cpu`` path's value checks."""
    emb, ref, is_self = prepare_embeddings(embeddings, ref_emb, check_values)
    validate_indices_tuple(indices_tuple, len(emb), len(ref), check_values)
    if len(emb) == 0 or len(ref) == 0:
        loss.num_valid_queries, loss.num_skipped_queries = 0, len(emb)
        return None
    loss.num_valid_queries, loss.num_skipped_queries = len(emb), 0
    given = pair_weights(indices_tuple, emb.device, check_values)
    with torch.no_grad():
        if indices_tuple is None and is_self:  # the diagonal, without index tensors
            pairs = LabelPairs(labels, ref_labels, diagonal=True)
        else:
            pairs = pair_source(labels, ref_labels, indices_tuple, is_self, self_index)
    chunkable = euclidean_embeddings(
        loss.distance, emb, ref, is_self, loss.gallery_gradient, normalize_rows
    )
    if chunkable is not None and backend == "triton":
        return triton_ranked_list_terms(
            *chunkable, pairs, **loss._params(), neg_weights=given, check_values=check_values
        )
    if chunkable is not None:
        return gpu_ranked_list_terms(
            *chunkable,
            pairs,
            **loss._params(),
            neg_weights=given,
            chunk_size=loss.chunk_size,
            check_values=check_values,
        )
    dist = distance_matrix(loss.distance, emb, ref, loss.gallery_gradient, normalize_rows)
    with torch.no_grad():
        pos, neg = pairs.candidates(0, len(emb))
    return gpu_ranked_list_terms_dense(
        dist, pos, neg, **loss._params(), neg_weights=given, check_values=check_values
    )


def sync_free_mine(
    miner, embeddings, labels, ref_emb, ref_labels, self_index, check_values
) -> WeightedPairs:
    """``RankedListMiner``'s pairs on the ``gpu`` kernels: one host read (the pair counts)."""
    emb, ref, is_self = prepare_embeddings(embeddings, ref_emb, check_values)
    if len(emb) == 0 or len(ref) == 0:
        empty = torch.zeros(0, dtype=torch.long, device=emb.device)
        if miner.collect_stats:
            miner.num_anchors_nothing_mined = len(emb)
        return WeightedPairs(empty, empty, empty, empty, weights=emb.new_zeros(0))
    pairs = pair_source(labels, ref_labels, None, is_self, self_index)
    chunkable = euclidean_embeddings(miner.distance, emb, ref, is_self, False, normalize_rows)
    if chunkable is not None:
        a1, p, a2, n, weights = gpu_ranked_list_mining(
            *chunkable, pairs, miner.alpha, miner.margin, miner.Tn, miner.chunk_size
        )
    else:
        dist = distance_matrix(miner.distance, emb, ref, False, normalize_rows)
        a1, p, a2, n, weights = gpu_mining_from_dist(
            dist, pairs, miner.alpha, miner.margin, miner.Tn
        )
    if miner.collect_stats:
        mined = torch.zeros(len(emb), dtype=torch.bool, device=emb.device)
        mined[a1] = True
        mined[a2] = True
        miner.num_anchors_nothing_mined = (~mined).sum()
    return WeightedPairs(a1, p, a2, n, weights=weights)


__all__ = ["sync_free_loss_terms", "sync_free_mine"]
