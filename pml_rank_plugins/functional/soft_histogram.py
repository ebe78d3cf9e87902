"""Soft histograms of pairwise scores by two-bin linear interpolation, fused with the similarity.

Both FastAP and mAP_Q histogram an affine function of the dot products ``S = Q R^T`` of
L2-normalized embeddings with a triangular kernel whose width equals the bin spacing ``delta``:
bin ``l`` (centre ``c_l``) receives ``max(0, 1 - |v - c_l| / delta)`` from a value ``v``. Such a
kernel is non-zero on at most the two centres around ``v``, with weights ``(1 - frac, frac)``,
``frac = v / delta - floor(v / delta)``; scattering those two weights gives *exactly* the dense
``L``-bin histogram in O(N M) instead of O(L N M) (FastAP paper eq. 9-10; Revaud et al. eq. 7).

Values are expressed in bin units, ``u = offset + scale * S``; ``u`` is clamped to ``[0, L]``, so
values outside the range saturate into the end bins (and get no gradient there).

Every pair ``(i, j)`` carries a category: 0 = positive, 1 = negative, 2 = ignored (self pair,
unmined pair). The output is ``(N, 2, L + 1)``: positive and negative histograms per query.

Memory: :class:`PairHistogram` keeps only ``Q``, ``R`` and the int8 categories for backward, and
recomputes each query chunk's scores there. Peak extra memory is O(chunk * M) floats (plus
O(N M) bytes of categories), independent of ``L``; time O(N M d) for the products (twice: forward
and recomputation) plus O(N M) elementwise work.
"""

from __future__ import annotations

import torch

POSITIVE, NEGATIVE, IGNORED = 0, 1, 2
DEFAULT_CHUNK_ELEMENTS = 1 << 22  # ~16 MB of float32 scores per chunk


def rows_per_chunk(num_rows: int, num_cols: int, chunk_size: int | None = None) -> int:
    """Query rows per chunk: ``chunk_size`` if given, else as many as fit in 4M score entries."""
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    return max(1, min(num_rows, DEFAULT_CHUNK_ELEMENTS // max(num_cols, 1)))


def _bin_coordinates(scores: torch.Tensor, offset: float, scale: float, num_intervals: int):
    """Left bin index (long) and interpolation weight of each score, plus the in-range mask."""
    u = scores * scale + offset
    inside = (u > 0) & (u < num_intervals)
    u = u.clamp(0, num_intervals)
    left = u.floor().clamp_(max=num_intervals - 1)
    frac = u - left
    return left.long(), frac, inside


class PairHistogram(torch.autograd.Function):
    """``(N, 2, L + 1)`` positive/negative soft histograms of ``offset + scale * Q R^T``.

    Inputs: ``queries`` (N, d), ``refs`` (M, d), ``categories`` (N, M) int8 in {0, 1, 2},
    ``offset``, ``scale`` (floats), ``num_intervals`` L >= 1, ``chunk_rows`` (rows per chunk).
    Differentiable w.r.t. ``queries`` and ``refs`` (pass the same tensor twice for self-ranking).
    """

    @staticmethod
    def forward(ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows):
        num_bins = num_intervals + 1
        out = queries.new_zeros(len(queries), 3 * num_bins)
        for start in range(0, len(queries), chunk_rows):
            stop = start + chunk_rows
            left, frac, _ = _bin_coordinates(
                queries[start:stop] @ refs.T, offset, scale, num_intervals
            )
            index = left + categories[start:stop].long() * num_bins
            out[start:stop].scatter_add_(1, index, 1 - frac)
            out[start:stop].scatter_add_(1, index + 1, frac)
        ctx.save_for_backward(queries, refs, categories)
        ctx.params = (offset, scale, num_intervals, chunk_rows)
        return out[:, : 2 * num_bins].reshape(len(queries), 2, num_bins)

    @staticmethod
    def backward(ctx, grad_hist):
        queries, refs, categories = ctx.saved_tensors
        offset, scale, num_intervals, chunk_rows = ctx.params
        num_bins = num_intervals + 1
        grad = torch.cat(
            [
                grad_hist.reshape(len(queries), 2 * num_bins),
                grad_hist.new_zeros(len(queries), num_bins),
            ],
            dim=1,
        )
        grad_queries = torch.zeros_like(queries) if ctx.needs_input_grad[0] else None
        grad_refs = torch.zeros_like(refs) if ctx.needs_input_grad[1] else None
        for start in range(0, len(queries), chunk_rows):
            stop = start + chunk_rows
            left, _, inside = _bin_coordinates(
                queries[start:stop] @ refs.T, offset, scale, num_intervals
            )
            index = left + categories[start:stop].long() * num_bins
            g = grad[start:stop]
            # d/du of (1 - frac) is -1 and of frac is +1 inside the range, 0 where clamped.
            grad_scores = (g.gather(1, index + 1) - g.gather(1, index)).mul_(inside).mul_(scale)
            if grad_queries is not None:
                grad_queries[start:stop] = grad_scores @ refs
            if grad_refs is not None:
                grad_refs.addmm_(grad_scores.T, queries[start:stop])
        return grad_queries, grad_refs, None, None, None, None, None


def pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories: torch.Tensor,
    offset: float,
    scale: float,
    num_intervals: int,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Positive/negative soft histograms, ``(N, 2, num_intervals + 1)``; see the module docstring.

    Args:
        queries: ``(N, d)`` L2-normalized query embeddings.
        refs: ``(M, d)`` L2-normalized reference embeddings (may be ``queries`` itself).
        categories: ``(N, M)`` int8, 0 positive, 1 negative, 2 ignored.
        offset, scale: the histogrammed value in bin units is ``offset + scale * q.r``.
        num_intervals: ``L``, the number of bin spacings; there are ``L + 1`` bin centres.
        chunk_size: query rows per chunk (``None``: about 4M scores per chunk).
    """
    if num_intervals < 1:
        raise ValueError(f"num_intervals must be >= 1, got {num_intervals}")
    if categories.shape != (len(queries), len(refs)):
        raise ValueError(
            f"categories must have shape {(len(queries), len(refs))}, got {tuple(categories.shape)}"
        )
    chunk_rows = rows_per_chunk(len(queries), len(refs), chunk_size)
    return PairHistogram.apply(
        queries,
        refs,
        categories.to(torch.int8),
        float(offset),
        float(scale),
        int(num_intervals),
        chunk_rows,
    )


def pair_categories(pos_mask: torch.Tensor, neg_mask: torch.Tensor) -> torch.Tensor:
    """int8 categories from boolean masks: 0 where ``pos_mask``, 1 where ``neg_mask``, else 2."""
    categories = torch.full(pos_mask.shape, IGNORED, dtype=torch.int8, device=pos_mask.device)
    categories[neg_mask] = NEGATIVE
    categories[pos_mask] = POSITIVE
    return categories
