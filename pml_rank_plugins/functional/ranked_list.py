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
  left to the caller (a PML reducer).

The weights are constants: they are computed without gradient, as in the authors' implementation,
so the gradient of ``L`` flows through the distances of the mined pairs only. On the mined pairs the
hinges are active, so ``dL/dd = w+`` for a mined positive and ``-lam w-`` for a mined negative:
every mined positive is pulled in and every mined negative pushed out, at any temperature.

Cost: O(N M) time and memory, a handful of ``(N, M)`` element-wise passes.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .validation import check_finite, compute_dtype


class RankedListTerms(NamedTuple):
    """Per-query RLL terms, each of shape ``(N,)``.

    ``loss`` (eq. 13) is differentiable with respect to ``dist``; ``pos_loss`` (eq. 11) and
    ``neg_loss`` (eq. 12) are detached copies of its two parts (``loss = pos_loss + lam neg_loss``);
    ``num_pos`` / ``num_neg`` count the mined (non-trivial) positives / negatives (int64).
    """

    loss: torch.Tensor
    pos_loss: torch.Tensor
    neg_loss: torch.Tensor
    num_pos: torch.Tensor
    num_neg: torch.Tensor


def check_rll_params(alpha: float, margin: float, Tn: float, Tp: float = 0.0, lam: float = 1.0):
    """Raise ``ValueError`` unless ``alpha > margin >= 0``, ``Tn, Tp, lam >= 0``, all finite."""
    values = {"alpha": alpha, "margin": margin, "Tn": Tn, "Tp": Tp, "lam": lam}
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a real number, got {value!r}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} must be finite, got {value}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if alpha <= margin:
        raise ValueError(
            f"alpha must be larger than margin (positive boundary alpha - margin > 0), "
            f"got alpha={alpha}, margin={margin}"
        )
    for name in ("Tn", "Tp", "lam"):
        if values[name] < 0:
            raise ValueError(f"{name} must be >= 0, got {values[name]}")


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


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row-wise softmax of ``temperature * scores`` restricted to ``mask``; zero elsewhere.

    ``w_ij = exp(T s_ij) / sum_{k in mask_i} exp(T s_ik)`` for ``j`` in ``mask_i``. The row maximum
    over the mask is subtracted before ``exp``, so every exponent is <= 0 on the mask and the
    largest is exactly 0: no overflow for any finite ``T``, the row sum is >= 1, and ``T = 0``
    gives uniform weights. Rows with an empty mask are all zero (never NaN). No gradient.
    Shapes ``(N, M)``; O(N M).
    """
    with torch.no_grad():
        row_max = scores.masked_fill(~mask, float("-inf")).amax(dim=1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        # Off-mask exponents may overflow to inf; they are replaced by 0 right away.
        e = torch.exp((scores - row_max) * temperature).masked_fill_(~mask, 0.0)
        return e / e.sum(dim=1, keepdim=True).clamp_min_(1.0)


def normalize_weights(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Given non-negative ``(N, M)`` weights, renormalize each row over ``mask`` to sum to 1.

    Rows whose masked weights sum to 0 are all zero. No gradient; O(N M).
    """
    with torch.no_grad():
        w = weights.masked_fill(~mask, 0.0)
        total = w.sum(dim=1, keepdim=True)
        return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 0.0)


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
) -> RankedListTerms:
    """Per-query Ranked List Loss ``L_i = L_P,i + lam L_N,i`` (eqs. 8-13) from distances.

    Args:
        dist: ``(N, M)`` distances (finite, floating point); gradient flows through it.
        pos_mask, neg_mask: ``(N, M)`` disjoint bool masks of the candidate positives / negatives
            of each query (self-pairs already removed). Only the non-trivial ones are used.
        alpha: negative boundary; margin ``m``: positives are pulled within ``alpha - m``.
        Tn: negative temperature (eq. 9); 0 gives uniform weights, large values approach
            hardest-negative weighting. Tp: positive temperature (journal version); 0 = mean.
        lam: weight of ``L_N`` (eq. 13).
        neg_weights, pos_weights: optional ``(N, M)`` non-negative relative weights used instead
            of the temperature weights (e.g. from :class:`RankedListMiner`); renormalized over
            each query's mined pairs. Treated as constants.

    Returns:
        :class:`RankedListTerms`. Queries with nothing mined have zero loss (and zero gradient).

    O(N M) time and memory.
    """
    check_rll_params(alpha, margin, Tn, Tp, lam)
    if dist.ndim != 2 or pos_mask.shape != dist.shape or neg_mask.shape != dist.shape:
        raise ValueError(
            f"dist, pos_mask and neg_mask must share one (N, M) shape, got {tuple(dist.shape)}, "
            f"{tuple(pos_mask.shape)}, {tuple(neg_mask.shape)}"
        )
    for name, w in (("neg_weights", neg_weights), ("pos_weights", pos_weights)):
        if w is not None and w.shape != dist.shape:
            raise ValueError(f"{name} must have shape {tuple(dist.shape)}, got {tuple(w.shape)}")
    check_finite(dist, "dist")
    # float16/bfloat16 distances are summed in float32; the gradient flows back in their dtype.
    dist = dist.to(compute_dtype(dist.dtype))
    if (pos_mask & neg_mask).any():
        raise ValueError("a (query, reference) pair is marked both positive and negative")
    pos_thr = alpha - margin
    with torch.no_grad():
        d = dist.detach()
        pos, neg = mine_non_trivial(d, pos_mask, neg_mask, alpha, margin)
        if neg_weights is None:
            wn = masked_softmax(alpha - d, neg, Tn)
        else:
            wn = normalize_weights(neg_weights.to(d.dtype), neg)
        if pos_weights is None:
            wp = masked_softmax(d - pos_thr, pos, Tp)
        else:
            wp = normalize_weights(pos_weights.to(d.dtype), pos)
        # One weight per pair (the mined sets are disjoint): w+ on positives, lam w- on negatives.
        w = torch.add(wp, wn, alpha=lam)
    # Active hinge of eq. 8 on every mined pair (> 0 there); other pairs have weight 0.
    hinge = torch.where(pos, dist - pos_thr, alpha - dist)
    loss = (w * hinge).sum(dim=1)
    with torch.no_grad():
        h = hinge.detach()
        pos_loss = (wp * h).sum(dim=1)
        neg_loss = (wn * h).sum(dim=1)
    return RankedListTerms(loss, pos_loss, neg_loss, pos.sum(dim=1), neg.sum(dim=1))
