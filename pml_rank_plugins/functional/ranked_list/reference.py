"""Ranked List Loss terms (Wang et al., "Ranked List Loss for Deep Metric Learning", CVPR 2019).

Everything here works on a precomputed ``(N, M)`` distance matrix ``dist`` between ``N`` queries
and ``M`` reference ("gallery") items and two boolean masks saying which reference items are
positives / negatives of each query. Pure torch, no PML import.

Per query ``i`` (notation of the paper, ``d = dist[i, j]``):

* pairwise margin loss (eq. 8): ``(1 - y) [alpha - d]_+ + y [d - (alpha - m)]_+``;
* non-trivial mining: positives with ``d > alpha - m``, negatives with ``d < alpha`` (every other
  pair has zero margin loss);
* negative weights (eq. 9, normalized as in eq. 12): ``w = exp(Tn (alpha - d))`` over the mined
  negatives, computed as a masked softmax with the row maximum subtracted, so no ``exp`` overflows
  for any finite ``Tn``;
* ``L_P`` (eq. 11): mean margin loss of the mined positives; with ``Tp > 0`` the positives are
  weighted by ``exp(Tp (d - (alpha - m)))``, normalized, as in the authors' journal version;
* ``L_N`` (eq. 12): weighted mean margin loss of the mined negatives;
* ``L = L_P + lam L_N`` (eq. 13); the batch loss is the mean of ``L`` over all queries (eq. 14),
  left to the caller (a PML reducer). ``lam_pos`` (default 1) weights ``L_P`` too, so PML's
  parametrization ``(1 - imbalance) L_P + imbalance L_N`` is ``lam_pos = 1 - b, lam = b``.

Query weighting (``query_weighting``, ``pml_rank_plugins.functional.query_weighting``):
``"mean"`` (default) is the paper's eq. 14, every query weighted ``1 / N``. ``"weight_share"`` is
what the authors' released Caffe layer (``DistanceWeightedValidPairLossV12``) does instead: query
``i`` is weighted ``c_i = 0.5 W_i / sum_k W_k``, ``W_i`` the sum of its *unnormalized* pair
weights (eq. 9 and its positive twin) over its mined pairs, a constant (no gradient); the
per-query loss returned is then ``N c_i L_i``, so that a mean over queries is ``sum_i c_i L_i``.

The weights are constants: they are computed without gradient, as in the authors' implementation,
so the gradient of ``L`` flows through the distances of the mined pairs only. On the mined pairs the
hinges are active, so ``dL/dd = w+`` for a mined positive and ``-lam w-`` for a mined negative:
every mined positive is pulled in and every mined negative pushed out, at any temperature.

Cost: O(N M) time and memory, a handful of ``(N, M)`` element-wise passes. This is the kernel for
any precomputed distance matrix; for Euclidean distances between embeddings,
:mod:`~pml_rank_plugins.functional.ranked_list.cpu` computes the same terms in O(chunk x M)
memory without ever holding an ``(N, M)`` float matrix.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..query_weighting import (
    log_weight_sums,
    query_scales,
)
from ..validation import check_finite, compute_dtype
from .params import check_dist_masks, check_loss_finite, check_loss_range, checked_params


class RankedListTerms(NamedTuple):
    """Per-query RLL terms, each of shape ``(N,)``.

    ``loss`` (eq. 13) is differentiable with respect to ``dist``; ``pos_loss`` (eq. 11) and
    ``neg_loss`` (eq. 12) are detached copies of its two parts
    (``loss = lam_pos pos_loss + lam neg_loss``, times ``N c_i`` under
    ``query_weighting="weight_share"``);
    ``num_pos`` / ``num_neg`` count the mined (non-trivial) positives / negatives (int64).
    """

    loss: torch.Tensor
    pos_loss: torch.Tensor
    neg_loss: torch.Tensor
    num_pos: torch.Tensor
    num_neg: torch.Tensor


def mine_non_trivial(
    dist: torch.Tensor,
    pos_mask: torch.Tensor,
    neg_mask: torch.Tensor,
    alpha: float,
    margin: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLL's non-trivial pairs: ``pos_mask & (d > alpha - margin)``, ``neg_mask & (d < alpha)``.

    These are exactly the pairs with a non-zero margin loss (eq. 8). Shapes ``(N, M)``; O(N M).
    """
    with torch.no_grad():
        return pos_mask & (dist > alpha - margin), neg_mask & (dist < alpha)


def _masked_exp(
    d: torch.Tensor, mask: torch.Tensor, temperature: float, sign: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalized weights ``e = exp(sign T (d - ext))`` on ``mask`` (0 elsewhere) and row sums.

    ``ext`` is the row maximum (``sign = +1``) or minimum (``sign = -1``) of ``d`` over the mask,
    so every exponent on the mask is <= 0 and the largest is 0: no overflow for any finite ``T``,
    and each non-empty row sums to >= 1. ``e / sum`` is the softmax of ``sign T d`` over the mask,
    which equals the softmax of ``sign T (d - c)`` for any constant ``c`` (e.g. ``alpha``).
    No gradient; a few ``(N, M)`` passes.
    """
    if temperature == 0.0 or d.numel() == 0:
        e = mask.to(d.dtype)
    else:
        fill = float("-inf") if sign > 0 else float("inf")
        masked = torch.where(mask, d, fill)
        ext = masked.amax(dim=1, keepdim=True) if sign > 0 else masked.amin(dim=1, keepdim=True)
        del masked
        ext = torch.where(torch.isfinite(ext), ext, torch.zeros_like(ext))
        # Difference first, then scale: the row's extreme gets exactly 0 (never inf - inf) and
        # off-mask exponents that overflow to inf are zeroed right after.
        e = scaled_exp_(torch.sub(d, ext).mul_(sign), temperature).masked_fill_(~mask, 0.0)
    return e, e.sum(dim=1)


def scaled_exp_(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """``exp(temperature * x)`` for ``x <= 0`` where it matters, in place when possible.

    A finite ``temperature`` above the largest value of ``x.dtype`` (e.g. ``1e39`` with float32)
    would round to ``inf`` and turn the exact zeros of ``x`` into ``0 * inf = NaN``; such a
    product is formed in float64 instead (any finite Python float is a float64), so
    ``exp(T * 0) = 1`` and every ``x < 0`` gives ``exp(-huge) = 0``: the hardest-pair limit,
    for every finite ``T``. O(numel).
    """
    if temperature <= torch.finfo(x.dtype).max:
        return x.mul_(temperature).exp_()
    return x.double().mul_(temperature).exp_().to(x.dtype)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row-wise softmax of ``temperature * scores`` restricted to ``mask``; zero elsewhere.

    ``w_ij = exp(T s_ij) / sum_{k in mask_i} exp(T s_ik)`` for ``j`` in ``mask_i``, computed with
    the row maximum over the mask subtracted: no overflow for any finite ``T`` (also in float16),
    ``T = 0`` gives uniform weights, rows with an empty mask are all zero (never NaN).
    No gradient. Shapes ``(N, M)``; O(N M).
    """
    with torch.no_grad():
        e, total = _masked_exp(scores, mask, temperature, sign=1.0)
        return e.div_(total.clamp_min(1.0).unsqueeze(1))


def negative_weights(dist: torch.Tensor, neg_mined: torch.Tensor, Tn: float) -> torch.Tensor:
    """RLL's negative weights (eq. 9, normalized as in eq. 12) on the mined negatives.

    ``w_ij = exp(Tn (alpha - d_ij)) / sum_k exp(Tn (alpha - d_ik))`` over ``neg_mined[i]``
    (``alpha`` cancels), as a masked softmax: no overflow for any finite ``Tn``; rows with no
    mined negative are zero. The same kernel :func:`ranked_list_terms` uses. No gradient; O(N M).
    """
    with torch.no_grad():
        e, total = _masked_exp(dist, neg_mined, Tn, sign=-1.0)
        return e.div_(total.clamp_min(1.0).unsqueeze(1))


def _given_weights(weights: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype):
    """Caller-supplied non-negative weights on ``mask``, scaled so each row's largest is 1
    (keeps ``1 / sum`` finite even for tiny weights), and their row sums."""
    e = weights.to(dtype).masked_fill(~mask, 0.0)
    if e.numel() == 0:
        return e, e.sum(dim=1)
    row_max = e.amax(dim=1, keepdim=True)
    e = e.div_(torch.where(row_max > 0, row_max, 1.0))
    return e, e.sum(dim=1)


class _LinearInDistance(torch.autograd.Function):
    """Returns precomputed per-query ``value``; backward: ``d value_i / d dist_ij = coef_ij``.

    Exact for RLL with constant weights: on the mined pairs every hinge is active, so each
    query's loss is linear in its distances with coefficient ``lam_pos w+`` (positives) or
    ``-lam w-`` (negatives), and 0 elsewhere. Saves one ``(N, M)`` matrix; backward is one pass.
    """

    @staticmethod
    def forward(ctx, dist, coef, value):
        ctx.save_for_backward(coef)
        return value.clone()

    @staticmethod
    def backward(ctx, grad_value):
        (coef,) = ctx.saved_tensors
        return coef * grad_value.unsqueeze(1), None, None


def ranked_list_terms(
    dist: torch.Tensor,
    pos_mask: torch.Tensor,
    neg_mask: torch.Tensor,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    Tp: float = 0.0,
    lam: float = 1.0,
    neg_weights: Optional[torch.Tensor] = None,
    pos_weights: Optional[torch.Tensor] = None,
    lam_pos: float = 1.0,
    query_weighting: str = "mean",
) -> RankedListTerms:
    """Per-query Ranked List Loss ``L_i = lam_pos L_P,i + lam L_N,i`` (eqs. 8-13) from distances.

    Args:
        dist: ``(N, M)`` distances (finite, floating point); gradient flows through it.
            float16/bfloat16 is computed in float32 (the gradient returns in ``dist.dtype``).
        pos_mask, neg_mask: ``(N, M)`` disjoint bool masks of the candidate positives / negatives
            of each query (self-pairs already removed). Only the non-trivial ones are used.
        alpha: negative boundary; margin ``m``: positives are pulled within ``alpha - m``.
        Tn: negative temperature (eq. 9); 0 gives uniform weights, large values approach
            hardest-negative weighting. Tp: positive temperature (journal version); 0 = mean.
        lam: weight of ``L_N`` (eq. 13).
        neg_weights, pos_weights: optional ``(N, M)`` non-negative relative weights used instead
            of the temperature weights (e.g. from :class:`~.miners.RankedListMiner`);
            renormalized over each query's mined pairs (a query whose mined pairs all have weight
            0 gets no loss from them). Treated as constants.
        lam_pos: weight of ``L_P`` (default 1, eq. 13); PML's ``imbalance=b`` is
            ``lam_pos=1 - b, lam=b``.
        query_weighting: ``"mean"`` (default; eq. 14): ``loss_i = L_i``, the batch loss is
            their mean. ``"weight_share"`` (the authors' Caffe layer, see
            ``pml_rank_plugins.functional.query_weighting``): ``loss_i = N c_i L_i`` with
            ``c_i = 0.5 W_i / sum_k W_k``, so the mean of ``loss`` is ``sum_i c_i L_i``. ``W_i``
            always uses ``Tn`` / ``Tp`` over the mined pairs, also when ``neg_weights`` /
            ``pos_weights`` replace the within-query weights.

    Returns:
        :class:`RankedListTerms` (``pos_loss`` / ``neg_loss`` are ``L_P`` / ``L_N`` unscaled by
        the query weighting). Queries with nothing mined have zero loss (and zero gradient).

    O(N M) time and memory: about 15 element-wise passes over ``(N, M)`` in the forward, one in
    the backward, which needs one saved ``(N, M)`` coefficient matrix.
    """
    checked_params(alpha, margin, Tn, Tp, lam, lam_pos, query_weighting=query_weighting)
    check_dist_masks(dist, pos_mask, neg_mask)
    for name, w in (("neg_weights", neg_weights), ("pos_weights", pos_weights)):
        if w is not None and w.shape != dist.shape:
            raise ValueError(f"{name} must have shape {tuple(dist.shape)}, got {tuple(w.shape)}")
    # One reduction screens for NaN/inf; the full element-wise check only runs to report them.
    if not torch.isfinite(dist.detach().sum()):
        check_finite(dist, "dist")
    if (pos_mask & neg_mask).any():
        raise ValueError("a (query, reference) pair is marked both positive and negative")
    # float16/bfloat16 distances are computed in float32; the gradient flows back in their dtype.
    dist = dist.to(compute_dtype(dist.dtype))
    check_loss_range(dist.dtype, alpha, lam, lam_pos)
    pos_thr = alpha - margin
    with torch.no_grad():
        d = dist.detach()
        pos, neg = mine_non_trivial(d, pos_mask, neg_mask, alpha, margin)
        if pos_weights is None:
            ep, zp = _masked_exp(d, pos, Tp, sign=1.0)  # exp(Tp (d - (alpha - m))), eq. 11
        else:
            ep, zp = _given_weights(pos_weights, pos, d.dtype)
        if neg_weights is None:
            en, zn = _masked_exp(d, neg, Tn, sign=-1.0)  # exp(Tn (alpha - d)), eq. 9
        else:
            en, zn = _given_weights(neg_weights, neg, d.dtype)
        inv_zp = torch.where(zp > 0, 1.0 / zp, 0.0)
        inv_zn = torch.where(zn > 0, 1.0 / zn, 0.0)
        # Weighted mean distance of the mined lists, then the hinge offsets (eqs. 11, 12).
        # Both are >= 0 exactly (every mined hinge is > 0); the clamp only removes rounding.
        pos_loss = (_row_dot(ep, d) * inv_zp - pos_thr).masked_fill_(zp <= 0, 0.0).clamp_min_(0)
        neg_loss = (alpha - _row_dot(en, d) * inv_zn).masked_fill_(zn <= 0, 0.0).clamp_min_(0)
        value = lam_pos * pos_loss + lam * neg_loss
        check_loss_finite(value, alpha, lam)
        # dL_i/dd_ij: lam_pos w+ on mined positives, -lam w- on mined negatives (weights held
        # constant).
        coef = en.mul_((-lam * inv_zn).unsqueeze(1)).addcmul_(ep, (lam_pos * inv_zp).unsqueeze(1))
        if query_weighting == "weight_share":
            # Each query's loss and gradient times its constant N c_i (the Caffe layer's weight).
            scale = query_scales(log_weight_sums(d, pos, neg, alpha, margin, Tn, Tp), Tn, Tp)
            scale = scale.to(d.dtype)
            value = value * scale
            check_loss_finite(value, alpha, lam)
            coef.mul_(scale.unsqueeze(1))
    loss = _LinearInDistance.apply(dist, coef, value) if dist.requires_grad else value
    return RankedListTerms(
        loss, pos_loss, neg_loss, _count(pos, zp, Tp, pos_weights), _count(neg, zn, Tn, neg_weights)
    )


def _count(mask: torch.Tensor, total: torch.Tensor, temperature: float, given) -> torch.Tensor:
    """Row counts of ``mask`` (int64); at ``T = 0`` the weight row sums already are the counts."""
    if temperature == 0.0 and given is None:
        return total.round().long()
    # int32 accumulation: summing a bool matrix into int64 costs a full widening copy.
    return mask.sum(dim=1, dtype=torch.int32).long()


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(1)`` for ``(N, M)`` tensors in one fused pass."""
    return torch.linalg.vecdot(a, b, dim=1)


__all__ = [
    "RankedListTerms",
    "masked_softmax",
    "mine_non_trivial",
    "negative_weights",
    "ranked_list_terms",
    "scaled_exp_",
]
