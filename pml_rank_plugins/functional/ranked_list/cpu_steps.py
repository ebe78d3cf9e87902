"""The per-chunk steps of the chunked Ranked List Loss kernel
(:mod:`~pml_rank_plugins.functional.ranked_list.cpu`; Wang et al., CVPR 2019, eqs. 8-12), for
one chunk of query rows against all ``M`` references, in reused ``(rows, M)`` buffers:

1. :func:`mine_chunk`: the Euclidean distances ``D = dist(Q_chunk, R)`` (one product), the
   candidates from the pair categories and RLL's non-trivial mining ``d > alpha - m`` /
   ``d < alpha`` (steps 1-2 of the kernel's docstring);
2. :func:`dense_weights`: the unnormalized weights, a masked softmax ``exp(Tp (d - max))`` over
   the mined positives and ``exp(Tn (min - d))`` over the mined negatives (or a miner's weights),
   so no exponent is positive (step 3);
3. the per-query sums ``Z+, S+, Z-, S-`` and the mined counts (step 4): :func:`dense_chunk_sums`
   over the whole buffers, or :func:`sparse_chunk` over the list of mined pairs, which also
   returns each pair's backward coefficient ``dL_i/dd_ij / d_ij``.

Each is O(rows x M) elementwise work (plus the ``rows x M x d`` product of step 1). Internal to
the chunked kernel (not exported by :mod:`pml_rank_plugins.functional`). Pure torch.
"""

from __future__ import annotations

from typing import Optional

import torch

from .params import ChunkParams
from .reference import scaled_exp_
from .sparse import SparseWeights, inverse_or_zero, segment_exp, segment_sum

_POSITIVE, _NEGATIVE = 0, 1


class Workspace:
    """The per-chunk buffers, allocated once per pass for ``(rows, M)``."""

    def __init__(self, rows: int, cols: int, like: torch.Tensor):
        self.dist = like.new_empty(rows, cols)
        self.w_pos = like.new_empty(rows, cols)
        self.w_neg = like.new_empty(rows, cols)
        self.pos = torch.empty(rows, cols, dtype=torch.bool, device=like.device)
        self.neg = torch.empty(rows, cols, dtype=torch.bool, device=like.device)
        self.cand = torch.empty(rows, cols, dtype=torch.bool, device=like.device)


def masked_exp_(
    w: torch.Tensor, mask: torch.Tensor, dist: torch.Tensor, T: float, sign: float
) -> torch.Tensor:
    """``w = exp(sign T (d - ext))`` on ``mask``, 0 elsewhere, ``ext`` the row max (sign +1) or
    min (sign -1) of ``d`` over the mask; every exponent <= 0 (see ``ranked_list._masked_exp``).
    Writes into ``w`` (returns it, or a new tensor when ``T`` exceeds the dtype's range)."""
    if T == 0.0:
        return w.copy_(mask)
    fill = dist.new_tensor(float("-inf") if sign > 0 else float("inf"))
    torch.where(mask, dist, fill, out=w)
    ext = w.amax(dim=1, keepdim=True) if sign > 0 else w.amin(dim=1, keepdim=True)
    ext.masked_fill_(~torch.isfinite(ext), 0.0)
    # Off the mask: (+-inf - ext) * sign = -inf, exp(-inf * T) = 0; on it: sign (d - ext) <= 0.
    w.sub_(ext)
    if sign < 0:
        w.neg_()
    return scaled_exp_(w, T)


def given_weights_(
    w: torch.Tensor, mask: torch.Tensor, source: SparseWeights, start: int
) -> torch.Tensor:
    """A miner's weights on ``mask``, each row scaled so its largest is 1 (``1 / Z`` finite)."""
    source.rows(start, start + len(w), w).mul_(mask)
    row_max = w.amax(dim=1, keepdim=True)
    return w.div_(torch.where(row_max > 0, row_max, 1.0))


def mine_chunk(
    queries: torch.Tensor,
    refs: torch.Tensor,
    ref_sq: torch.Tensor,
    cat: torch.Tensor,
    params: ChunkParams,
    ws: Workspace,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-2 (distances, mining) for a chunk of query rows with categories ``cat``:
    ``(dist, pos, neg)`` views into the workspace."""
    rows = len(queries)
    dist, pos, neg, cand = ws.dist[:rows], ws.pos[:rows], ws.neg[:rows], ws.cand[:rows]
    # |q|^2 broadcast into the product's output, |r|^2 added in place (as euclidean_distances).
    torch.addmm((queries * queries).sum(1, keepdim=True), queries, refs.T, alpha=-2.0, out=dist)
    dist.add_(ref_sq).clamp_min_(0.0).sqrt_()
    torch.gt(dist, params.alpha - params.margin, out=pos)
    pos.logical_and_(torch.eq(cat, _POSITIVE, out=cand))
    torch.lt(dist, params.alpha, out=neg)
    neg.logical_and_(torch.eq(cat, _NEGATIVE, out=cand))
    return dist, pos, neg


def dense_weights(
    dist: torch.Tensor,
    pos: torch.Tensor,
    neg: torch.Tensor,
    neg_source: Optional[SparseWeights],
    params: ChunkParams,
    ws: Workspace,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3 (weights) over the whole chunk: unnormalized ``(w_pos, w_neg)`` views into the
    workspace."""
    rows = len(dist)
    w_pos = masked_exp_(ws.w_pos[:rows], pos, dist, params.Tp, 1.0)
    if neg_source is None:
        w_neg = masked_exp_(ws.w_neg[:rows], neg, dist, params.Tn, -1.0)
    else:
        w_neg = given_weights_(ws.w_neg[:rows], neg, neg_source, start)
    return w_pos, w_neg


def dense_chunk_sums(
    dist: torch.Tensor,
    pos: torch.Tensor,
    neg: torch.Tensor,
    neg_source: Optional[SparseWeights],
    params: ChunkParams,
    ws: Workspace,
    start: int,
) -> tuple[torch.Tensor, ...]:
    """Per-row ``(Z+, S+, Z-, S-, #pos, #neg)`` of a chunk over its full ``(rows, M)`` buffers."""
    w_pos, w_neg = dense_weights(dist, pos, neg, neg_source, params, ws, start)
    return (
        w_pos.sum(1),
        torch.linalg.vecdot(w_pos, dist),
        w_neg.sum(1),
        torch.linalg.vecdot(w_neg, dist),
        pos.sum(1, dtype=torch.int32),
        neg.sum(1, dtype=torch.int32),
    )


def sparse_chunk(
    dist: torch.Tensor,
    pos: torch.Tensor,
    mined: torch.Tensor,
    neg_source: Optional[SparseWeights],
    params: ChunkParams,
    ws: Workspace,
    start: int,
) -> tuple[tuple[torch.Tensor, ...], tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-row sums of a chunk from its list of mined pairs, and that list with each pair's
    backward coefficient ``dL_i/dd_ij / d_ij``: ``(start, local rows, columns, coefficients)``."""
    rows = len(dist)
    row, col = mined.nonzero(as_tuple=True)
    d, is_pos = dist[row, col], pos[row, col]
    is_neg = ~is_pos
    rp, dp = row[is_pos], d[is_pos]
    rn, cn, dn = row[is_neg], col[is_neg], d[is_neg]
    e_pos = segment_exp(dp, rp, rows, params.Tp, 1.0)
    if neg_source is None:
        e_neg = segment_exp(dn, rn, rows, params.Tn, -1.0)
    else:  # a miner's weights, each row scaled so its largest is 1 (as the dense path)
        e_neg = neg_source.rows(start, start + rows, ws.w_neg[:rows])[rn, cn]
        row_max = e_neg.new_zeros(rows).scatter_reduce_(0, rn, e_neg, "amax")
        e_neg = e_neg / torch.where(row_max > 0, row_max, 1.0)[rn]
    z_pos, z_neg = segment_sum(e_pos, rp, rows), segment_sum(e_neg, rn, rows)
    sums = (
        z_pos,
        segment_sum(e_pos * dp, rp, rows),
        z_neg,
        segment_sum(e_neg * dn, rn, rows),
        torch.bincount(rp, minlength=rows),
        torch.bincount(rn, minlength=rows),
    )
    # dL_i/dd_ij = lam_pos w+_ij / Z+_i on positives, -lam w-_ij / Z-_i on negatives; then
    # / d_ij (0 at d = 0, the cdist convention; a mined positive has d > alpha - m > 0).
    c_pos = e_pos.mul_(inverse_or_zero(z_pos)[rp]).mul_(params.lam_pos).div_(dp)
    c_neg = e_neg.mul_(inverse_or_zero(z_neg)[rn]).mul_(-params.lam).div_(dn)
    c_neg.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    stored = (
        start,
        torch.cat([rp, rn]).int(),
        torch.cat([col[is_pos], cn]).int(),
        torch.cat([c_pos, c_neg]),
    )
    return sums, stored


__all__ = [
    "ChunkParams",
    "Workspace",
    "dense_chunk_sums",
    "dense_weights",
    "given_weights_",
    "masked_exp_",
    "mine_chunk",
    "sparse_chunk",
]
