"""The per-chunk steps of the ``gpu`` Ranked List Loss kernel
(:mod:`~pml_rank_plugins.functional.ranked_list.gpu`; Wang et al., CVPR 2019, eqs. 8-12), written
without host synchronisation: masks and multiplications, never ``nonzero``, boolean indexing,
``.item()``, ``bool(tensor)``, ``unique`` or ``bincount``.

* Pair candidates: :class:`LabelPairs` compares the labels of a chunk with all reference labels
  (no ``unique`` relabelling, unlike :class:`~pml_rank_plugins.functional.chunking.LabelCategories`),
  :class:`DensePairs` reads rows of an ``(N, M)`` int8 category tensor (a miner's pairs).
* :class:`DenseWeights`: a miner's weights of a sparse pair list scattered into a chunk's rows,
  pairs of other chunks sent to one spare row (no boolean selection).
* :func:`mine`: distances ``D = dist(Q_chunk, R)`` (one product, the same operations as
  :func:`~pml_rank_plugins.functional.ranked_list.cpu_steps.mine_chunk`) and RLL's non-trivial
  mining; :func:`weights`: the unnormalized masked-softmax weights; :func:`row_sums`: ``Z+, S+,
  Z-, S-`` and the mined counts.
* :func:`query_scales`: the ``"weight_share"`` factors ``N c_i`` without the host checks of
  :func:`~pml_rank_plugins.functional.query_weighting.query_scales`.

Each step is O(rows x M) elementwise work (plus the ``rows x M x d`` product of :func:`mine`).
Pure torch.
"""

from __future__ import annotations

from typing import Optional

import torch

from .params import ChunkParams
from .reference import scaled_exp_

_POSITIVE, _NEGATIVE = 0, 1


def _rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``tensor[start:stop]``, or ``tensor`` itself when that is all of it (one operator less per
    call in the one-chunk case, which the operator budget counts)."""
    return tensor if start == 0 and stop == len(tensor) else tensor[start:stop]


class LabelPairs:
    """Candidates from labels: positives share the query's label (minus its own column,
    ``self_columns[i]``, when given, or the diagonal with ``diagonal=True``: the batch against
    itself, no index tensor needed), negatives do not. O(rows x M) per chunk, nothing N x M
    stored, no host synchronisation."""

    def __init__(
        self,
        labels,
        ref_labels,
        self_columns: Optional[torch.Tensor] = None,
        diagonal: bool = False,
    ):
        if diagonal and self_columns is not None:
            raise ValueError("pass self_columns or diagonal=True, not both")
        self.labels, self.ref_labels = labels.view(-1, 1), ref_labels.view(1, -1)
        self.self_columns = None if self_columns is None else self_columns.view(-1, 1)
        self.diagonal = diagonal
        self.columns = None
        if self_columns is not None:
            self.columns = torch.arange(len(ref_labels), device=ref_labels.device).view(1, -1)

    def candidates(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pos_candidates, neg_candidates)``, ``(rows, M)`` bool."""
        same = torch.eq(_rows(self.labels, start, stop), self.ref_labels)
        differ = torch.logical_not(same)
        if self.diagonal:  # the own column of query i is column i (same label: not in differ)
            same.diagonal(start).fill_(False)
        elif self.self_columns is not None:
            same = same.logical_and_(self.columns != _rows(self.self_columns, start, stop))
        return same, differ


class DensePairs:
    """Candidates from an ``(N, M)`` int8 category tensor (0 positive, 1 negative, 2 ignored)."""

    def __init__(self, categories: torch.Tensor):
        self.categories = categories

    def candidates(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        cat = _rows(self.categories, start, stop)
        return torch.eq(cat, _POSITIVE), torch.eq(cat, _NEGATIVE)


def dense_pair_categories(
    num_queries: int,
    num_refs: int,
    a1: torch.Tensor,
    p: torch.Tensor,
    a2: torch.Tensor,
    n: torch.Tensor,
    self_columns: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``(N, M)`` int8 categories of mined pairs ``(a1, p)`` / ``(a2, n)``: 0 positive, 1
    negative, 2 elsewhere and at ``self_columns[i]``. A pair given as both is positive here (the
    ``cpu`` path refuses it, a check that reads values). Index assignments only; O(N M) bytes."""
    cats = torch.full((num_queries, num_refs), 2, dtype=torch.int8, device=a1.device)
    cats.index_put_((a2, n), torch.tensor(_NEGATIVE, dtype=torch.int8, device=a1.device))
    cats.index_put_((a1, p), torch.tensor(_POSITIVE, dtype=torch.int8, device=a1.device))
    if self_columns is not None:
        rows = torch.arange(num_queries, device=a1.device)
        cats.index_put_((rows, self_columns), torch.tensor(2, dtype=torch.int8, device=a1.device))
    return cats


class DenseWeights:
    """A miner's non-negative weights of pairs ``(anchors, refs)``, written into a chunk's rows
    of a ``(rows + 1, M)`` buffer: pairs whose anchor is outside the chunk go to the last row,
    which is dropped. O(pairs + rows x M) per chunk, no host synchronisation. Duplicate pairs:
    one of their weights is kept, as with dense assignment."""

    def __init__(self, anchors: torch.Tensor, refs: torch.Tensor, weights: torch.Tensor):
        self.anchors, self.refs, self.weights = anchors, refs, weights

    def rows(self, start: int, stop: int, num_refs: int, dtype: torch.dtype) -> torch.Tensor:
        rows = stop - start
        out = torch.zeros(rows + 1, num_refs, dtype=dtype, device=self.weights.device)
        local = self.anchors - start
        inside = (local >= 0) & (local < rows)
        out.index_put_((torch.where(inside, local, rows), self.refs), self.weights.to(dtype))
        return out[:rows]


def mine(
    queries: torch.Tensor,
    refs: torch.Tensor,
    ref_sq: torch.Tensor,
    candidates: tuple[torch.Tensor, torch.Tensor],
    params: ChunkParams,
    q_sq: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distances of a chunk (the operations of ``cpu_steps.mine_chunk``) and RLL's
    non-trivial pairs ``pos & (d > alpha - m)``, ``neg & (d < alpha)``: ``(dist, pos, neg)``.
    ``q_sq``: the ``(rows, 1)`` squared norms of ``queries`` if already known (the batch against
    itself: ``ref_sq``, the same operation on the same rows), else computed."""
    if q_sq is None:
        q_sq = (queries * queries).sum(1, keepdim=True)
    dist = torch.addmm(q_sq, queries, refs.T, alpha=-2.0).add_(ref_sq).clamp_min_(0.0).sqrt_()
    pos = torch.gt(dist, params.alpha - params.margin).logical_and_(candidates[0])
    neg = torch.lt(dist, params.alpha).logical_and_(candidates[1])
    return dist, pos, neg


def masked_exp(dist: torch.Tensor, mask: torch.Tensor, T: float, sign: float) -> torch.Tensor:
    """``exp(sign T (d - ext))`` on ``mask``, 0 elsewhere, ``ext`` the row max (sign +1) or min
    (sign -1) over the mask: the values of ``cpu_steps.masked_exp_`` (``ext - d``
    equals ``-(d - ext)`` exactly). Off the mask the exponent is ``-inf``, so no mask multiply."""
    if T == 0.0 or dist.shape[1] == 0:
        return mask.to(dist.dtype)
    w = torch.where(mask, dist, float("-inf") if sign > 0 else float("inf"))
    ext = w.amax(dim=1, keepdim=True) if sign > 0 else w.amin(dim=1, keepdim=True)
    ext = ext.nan_to_num_(posinf=0.0, neginf=0.0)  # an empty row: +-inf -> 0 (as the cpu path)
    w = w.sub_(ext) if sign > 0 else torch.sub(ext, w, out=w)
    return scaled_exp_(w, T)


def weights(
    dist: torch.Tensor,
    pos: torch.Tensor,
    neg: torch.Tensor,
    params: ChunkParams,
    given: Optional[DenseWeights],
    start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalized ``(w_pos, w_neg)`` of a chunk: ``exp(Tp (d - max))`` on the mined positives,
    ``exp(Tn (min - d))`` on the mined negatives, or a miner's weights scaled so each row's
    largest is 1 (as ``cpu_steps.given_weights_``)."""
    w_pos = masked_exp(dist, pos, params.Tp, 1.0)
    if given is None:
        return w_pos, masked_exp(dist, neg, params.Tn, -1.0)
    w_neg = given.rows(start, start + len(dist), dist.shape[1], dist.dtype).mul_(neg)
    if dist.shape[1] == 0:
        return w_pos, w_neg
    row_max = w_neg.amax(dim=1, keepdim=True)
    return w_pos, w_neg.div_(torch.where(row_max > 0, row_max, 1.0))


def row_sums(dist, pos, neg, w_pos, w_neg) -> tuple[torch.Tensor, ...]:
    """``(Z+, S+, Z-, S-, #pos, #neg)`` per row: weight sums, weighted distance sums, counts."""
    return (
        w_pos.sum(1),
        torch.linalg.vecdot(w_pos, dist),
        w_neg.sum(1),
        torch.linalg.vecdot(w_neg, dist),
        pos.sum(1),
        neg.sum(1),
    )


def inverse_or_zero(total: torch.Tensor) -> torch.Tensor:
    """``1 / total`` where ``total > 0``, else 0 (a row without mined pairs); NaN stays NaN.
    ``total`` is a sum of weights whose largest is 1 (or a count), so it is 0 or >= 1: the
    reciprocal is infinite only at 0 (two operators instead of four: host time per call)."""
    return total.reciprocal().nan_to_num_(nan=float("nan"), posinf=0.0, neginf=0.0)


def query_scales(log_w: torch.Tensor) -> torch.Tensor:
    """``N c_i = N 0.5 W_i / sum_k W_k`` (float64) from ``log W_i``, as
    :func:`~pml_rank_plugins.functional.query_weighting.query_scales` but without reading values
    back: all zero when nothing is mined anywhere (every ``log W = -inf``); a ``log W = +inf``
    (temperatures overflowing float64) gives NaN here, which that function reports as a
    ``ValueError`` (run with ``check_values=True`` to get the error). O(N)."""
    top = log_w.max().nan_to_num(posinf=0.0, neginf=0.0)
    share = torch.exp(log_w - top)
    total = share.sum()
    return share.mul_(0.5 * len(log_w) / torch.where(total > 0, total, 1.0))


__all__ = [
    "DensePairs",
    "DenseWeights",
    "LabelPairs",
    "dense_pair_categories",
    "inverse_or_zero",
    "masked_exp",
    "mine",
    "query_scales",
    "row_sums",
    "weights",
]
