"""Query weighting of the Ranked List Loss (Wang et al., "Ranked List Loss for Deep Metric
Learning", CVPR 2019): how the per-query losses ``L_i`` (eq. 13) form the batch loss.

``query_weighting="mean"`` (default) is the paper's eq. 14, every query weighted ``1 / N``.
``"weight_share"`` is what the authors' released Caffe layer does instead
(``DistanceWeightedValidPairLossV12``, file
``CaffeMex_RLL_GR_V03_Simp/src/caffe/layers/distance_weighted_valid_pair_loss_V12_layer.cpp`` of
github.com/XinshaoAmosWang/Ranked-List-Loss-for-DML, the loss layer of its released
``train.prototxt`` files): query ``i`` is weighted ``c_i = 0.5 W_i / sum_k W_k``, where
``W_i = sum_{j in P*_i} exp(Tp (d_ij - (alpha - m))) + sum_{j in N*_i} exp(Tn (alpha - d_ij))``
is the sum of query ``i``'s *unnormalized* pair weights (eq. 9 and its positive twin) over its
mined positives ``P*_i`` and negatives ``N*_i``, so the batch loss is ``sum_i c_i L_i``: queries
with many or hard violating pairs dominate, and the weights sum to 0.5 rather than 1. Within a
query the Caffe layer is eqs. 8-12 (each sign normalized by its own weight sum, both signs
added with weight 1). The ``0.5`` comes from its loop over unordered pairs ``(a, b)``, whose
gradient reaches both ends, each end scaled by ``0.5 w_ab / S_end`` (``S`` the end's weight sum
of that sign) times ``(S+_end + S-_end) / W``, ``W = sum_i (S+_i + S-_i)``; its ``1e-8`` added
to each sum (against division by zero) is left out here (a query without mined pairs has
``c_i = 0`` and ``L_i = 0``). So that a mean over queries still gives the batch loss, the
per-query loss under ``"weight_share"`` is ``N c_i L_i``. ``c_i`` is a constant (no gradient),
like the pair weights, as in the Caffe layer. It is a softmax over the queries of ``log W_i``
(formed in float64 by a log-sum-exp of ``T v``), so nothing overflows even where
``exp(Tn (alpha - d))`` would (from ``Tn ~ 600``); only a ``T v`` beyond float64's range
(``T`` near 1e308) raises ``ValueError``.

Used by both kernels,
:func:`~pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms` (on its ``(N, M)``
distances) and
:func:`~pml_rank_plugins.functional.ranked_list.cpu.chunked_ranked_list_terms` (chunk by
chunk). Pure torch, no PML import.
"""

from __future__ import annotations

import torch

QUERY_WEIGHTINGS = ("mean", "weight_share")


def check_query_weighting(query_weighting) -> str:
    """``query_weighting`` if it is one of :data:`QUERY_WEIGHTINGS`, else ``ValueError`` naming
    the argument and the choices."""
    if not isinstance(query_weighting, str) or query_weighting not in QUERY_WEIGHTINGS:
        choices = ", ".join(repr(c) for c in QUERY_WEIGHTINGS)
        raise ValueError(
            f"query_weighting must be one of {choices} ('mean': the paper's eq. 14; "
            f"'weight_share': the authors' Caffe layer), got {query_weighting!r}"
        )
    return query_weighting


def log_weight_sums(
    dist: torch.Tensor,
    pos: torch.Tensor,
    neg: torch.Tensor,
    alpha: float,
    margin: float,
    Tn: float,
    Tp: float,
) -> torch.Tensor:
    """``log W_i`` in float64, ``W_i`` the sum of query ``i``'s unnormalized pair weights.

    ``W_i = sum_{pos} exp(Tp (d - (alpha - m))) + sum_{neg} exp(Tn (alpha - d))`` over the mined
    pairs ``pos`` / ``neg`` (``(N, M)`` bools; ``dist`` ``(N, M)``, any float dtype); ``-inf`` for
    a row with nothing mined. Formed as a log-sum-exp of ``T v`` (``v > 0`` on every mined pair,
    so each mined row is ``>= 0``), so no ``exp`` overflows; ``+inf`` only where ``T v`` itself
    exceeds float64's range. Returns ``(N,)`` float64. No gradient; a few ``(N, M)`` float64
    passes, O(N M).
    """
    with torch.no_grad():
        d = dist.detach().double()
        x = torch.full_like(d, float("-inf"))
        x = torch.where(pos, (d - (alpha - margin)).mul_(Tp), x)
        x = torch.where(neg, (alpha - d).mul_(Tn), x)
        return torch.logsumexp(x, dim=1)


def query_scales(log_w: torch.Tensor, Tn: float, Tp: float) -> torch.Tensor:
    """``N c_i = N 0.5 W_i / sum_k W_k`` (float64, ``(N,)``) from ``log W_i``
    (:func:`log_weight_sums`): the factor turning each query's ``L_i`` into its
    ``"weight_share"`` loss, so that the mean over the ``N`` queries is ``sum_i c_i L_i``.

    A softmax over the queries (largest ``log W`` subtracted): exact for any finite log-weights;
    all zero when nothing is mined anywhere. ``ValueError`` naming ``Tn`` / ``Tp`` when a log-weight
    overflowed float64. O(N).
    """
    if bool((log_w == float("inf")).any()):
        raise ValueError(
            f"query_weighting='weight_share': the pair log-weights Tn (alpha - d) / Tp (d - "
            f"(alpha - margin)) overflow float64 with Tn={Tn:g}, Tp={Tp:g}; use smaller "
            "temperatures or query_weighting='mean'"
        )
    n = len(log_w)
    if n == 0 or not bool(torch.isfinite(log_w).any()):
        return torch.zeros_like(log_w)
    share = torch.exp(log_w - log_w.max())
    return share.mul_(0.5 * n / share.sum())


__all__ = ["QUERY_WEIGHTINGS", "check_query_weighting", "log_weight_sums", "query_scales"]
