"""Sparse parts of the chunked Ranked List Loss
(:mod:`~pml_rank_plugins.functional.ranked_list.cpu`): a miner's weights as a sparse list
cut into chunks, and per-row reductions over lists of mined pairs."""

from __future__ import annotations

import torch

from .reference import scaled_exp_


class SparseWeights:
    """Non-negative weights of (query, reference) pairs as a sparse list, rows cut out per chunk.

    ``rows(start, stop, out)`` writes the chunk's weights into ``out`` (zero elsewhere); each
    chunk costs O(rows x M + pairs in the chunk). Duplicate pairs: one of their weights is kept,
    as with dense assignment.
    """

    def __init__(self, anchors: torch.Tensor, refs: torch.Tensor, weights: torch.Tensor):
        order = torch.argsort(anchors, stable=True)
        self.anchors, self.refs, self.weights = anchors[order], refs[order], weights[order]

    def rows(self, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        bounds = torch.tensor([start, stop], device=self.anchors.device)
        lo, hi = torch.searchsorted(self.anchors, bounds).tolist()
        if hi > lo:
            out[self.anchors[lo:hi] - start, self.refs[lo:hi]] = self.weights[lo:hi].to(out.dtype)
        return out


def segment_exp(d, row, rows: int, T: float, sign: float) -> torch.Tensor:
    """Sparse twin of ``cpu_steps.masked_exp_``: ``exp(sign T (d - ext[row]))``
    for a list of mined distances ``d`` of query rows ``row``, ``ext`` the per-row max (sign +1)
    or min (sign -1)."""
    if T == 0.0:
        return torch.ones_like(d)
    fill, how = (float("-inf"), "amax") if sign > 0 else (float("inf"), "amin")
    ext = d.new_full((rows,), fill).scatter_reduce_(0, row, d, how, include_self=False)
    x = d - ext[row]  # the same difference, hence the same exponent, as the dense path
    if sign < 0:
        x.neg_()
    return scaled_exp_(x, T)


def segment_sum(values: torch.Tensor, row: torch.Tensor, rows: int) -> torch.Tensor:
    """``(rows,)`` sums of ``values`` grouped by their row index ``row``."""
    return values.new_zeros(rows).index_add_(0, row, values)


def inverse_or_zero(total: torch.Tensor) -> torch.Tensor:
    """``1 / total`` where ``total > 0``, else 0 (a row without mined pairs)."""
    return torch.where(total > 0, 1.0 / total, 0.0)
