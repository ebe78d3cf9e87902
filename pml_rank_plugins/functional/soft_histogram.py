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

Categories come from a *source* with ``rows(start, stop)``: :class:`DenseCategories` wraps an
``(N, M)`` int8 tensor (pairs from a miner), :class:`LabelCategories` derives each chunk's
categories from the labels (same label = positive, else negative, self pair ignored), so no
float or int64 N x M tensor is ever materialized.

Memory and time: forward computes each query chunk's scores, scatters them, and keeps for backward
one small integer per pair (its histogram column, or a zero-gradient column when the score was
clamped): N M bytes for up to 84 intervals. Backward gathers the histogram gradient with those
codes and needs no recomputation. Peak extra memory is O(chunk * M) floats + N M bytes (+ N M
bytes of dense categories with a miner), independent of ``L``; time two O(N M d) products
(scores; gradients) plus O(N M) elementwise work.
"""

from __future__ import annotations

import torch

POSITIVE, NEGATIVE, IGNORED = 0, 1, 2
# Rows per chunk are chosen so a chunk's scores (and the few same-sized temporaries) stay in cache:
# the elementwise work is memory-bound, and cache-sized chunks run it about twice as fast.
DEFAULT_CHUNK_ELEMENTS = 1 << 18


def rows_per_chunk(num_rows: int, num_cols: int, chunk_size: int | None = None) -> int:
    """Query rows per chunk: ``chunk_size`` if given, else as many as fit in 256K scores."""
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    return max(1, min(num_rows, DEFAULT_CHUNK_ELEMENTS // max(num_cols, 1)))


def _bin_units(queries, refs, categories, offset, scale, num_intervals):
    """Scores of one chunk in bin units, ``u = offset + scale * Q R^T`` (unclamped), and the
    histogram column of the left neighbouring centre: ``floor(clamp(u)) + category * (L + 1)``."""
    u = torch.addmm(queries.new_tensor(offset), queries, refs.T, alpha=scale)
    left = u.clamp(0, num_intervals).floor_()
    # At u = L the left bin is L with frac 0: its right neighbour gets weight 0, so the histogram
    # has one spare column at the end rather than a second clamp here.
    column = left.add(categories.to(u.dtype), alpha=num_intervals + 1).long()
    return u, left, column


def _code_dtype(num_columns: int) -> torch.dtype:
    """Smallest integer dtype holding histogram column indices below ``num_columns``."""
    if num_columns <= 256:
        return torch.uint8
    return torch.int16 if num_columns <= 1 << 15 else torch.int32


class DenseCategories:
    """Category source over a precomputed ``(N, M)`` int8 tensor."""

    def __init__(self, categories: torch.Tensor):
        self.categories = categories.to(torch.int8)
        self.shape = tuple(categories.shape)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        return self.categories[start:stop]


class LabelCategories:
    """Categories computed per chunk from labels: 0 where the labels match, 1 where they differ,
    2 at ``self_columns[i]`` (the query's own column when ranking a batch against itself).
    O(chunk * M) per call; nothing of size N x M is stored."""

    def __init__(self, labels: torch.Tensor, ref_labels: torch.Tensor, self_columns=None):
        self.labels, self.ref_labels, self.self_columns = labels, ref_labels, self_columns
        self.shape = (len(labels), len(ref_labels))

    def rows(self, start: int, stop: int) -> torch.Tensor:
        labels = self.labels[start:stop]
        categories = (labels.view(-1, 1) != self.ref_labels.view(1, -1)).to(torch.int8)
        if self.self_columns is not None:
            local = torch.arange(len(labels), device=labels.device)
            categories[local, self.self_columns[start:stop]] = IGNORED
        return categories


class PairHistogram(torch.autograd.Function):
    """``(N, 2, L + 1)`` positive/negative soft histograms of ``offset + scale * Q R^T``.

    Inputs: ``queries`` (N, d), ``refs`` (M, d), ``categories`` a category source (rows of
    int8 in {0, 1, 2}),
    ``offset``, ``scale`` (floats), ``num_intervals`` L >= 1, ``chunk_rows`` (rows per chunk).
    Differentiable w.r.t. ``queries`` and ``refs`` (pass the same tensor twice for self-ranking).
    """

    @staticmethod
    def forward(ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows):
        num_bins = num_intervals + 1
        out = queries.new_zeros(len(queries), 3 * num_bins + 1)
        trash = 2 * num_bins  # first column of the ignored segment
        codes = torch.empty(len(queries), len(refs), dtype=_code_dtype(3 * num_bins + 1))
        for start in range(0, len(queries), chunk_rows):
            stop = start + chunk_rows
            u, left, column = _bin_units(
                queries[start:stop],
                refs,
                categories.rows(start, stop),
                offset,
                scale,
                num_intervals,
            )
            # Backward needs, per pair, only the left column and whether u was inside (0, L);
            # clamped pairs point at the ignored segment, whose gradient is zero.
            codes[start:stop] = column
            codes[start:stop].masked_fill_((u <= 0) | (u >= num_intervals), trash)
            frac = u.clamp_(0, num_intervals).sub_(left)
            out[start:stop].scatter_add_(1, column + 1, frac)
            out[start:stop].scatter_add_(1, column, frac.neg_().add_(1))
        ctx.save_for_backward(queries, refs, codes)
        ctx.params = (scale, num_intervals, chunk_rows)
        return out[:, : 2 * num_bins].reshape(len(queries), 2, num_bins)

    @staticmethod
    def backward(ctx, grad_hist):
        queries, refs, codes = ctx.saved_tensors
        scale, num_intervals, chunk_rows = ctx.params
        num_bins = num_intervals + 1
        grad = grad_hist.new_zeros(len(queries), 3 * num_bins + 1)
        grad[:, : 2 * num_bins] = grad_hist.reshape(len(queries), 2 * num_bins)
        grad_queries = torch.zeros_like(queries) if ctx.needs_input_grad[0] else None
        grad_refs = torch.zeros_like(refs) if ctx.needs_input_grad[1] else None
        for start in range(0, len(queries), chunk_rows):
            stop = start + chunk_rows
            column = codes[start:stop].long()
            g = grad[start:stop]
            # Inside (0, L), d(frac)/du = 1 and d(1 - frac)/du = -1; clamped and ignored pairs
            # read two columns of the zero-gradient ignored segment.
            grad_scores = g.gather(1, column + 1).sub_(g.gather(1, column)).mul_(scale)
            if grad_queries is not None:
                grad_queries[start:stop] = grad_scores @ refs
            if grad_refs is not None:
                grad_refs.addmm_(grad_scores.T, queries[start:stop])
        return grad_queries, grad_refs, None, None, None, None, None


def pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories,
    offset: float,
    scale: float,
    num_intervals: int,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Positive/negative soft histograms, ``(N, 2, num_intervals + 1)``; see the module docstring.

    Args:
        queries: ``(N, d)`` L2-normalized query embeddings.
        refs: ``(M, d)`` L2-normalized reference embeddings (may be ``queries`` itself).
        categories: ``(N, M)`` int8 tensor (0 positive, 1 negative, 2 ignored) or a category
            source (:class:`LabelCategories`, :class:`DenseCategories`).
        offset, scale: the histogrammed value in bin units is ``offset + scale * q.r``.
        num_intervals: ``L``, the number of bin spacings; there are ``L + 1`` bin centres.
        chunk_size: query rows per chunk (``None``: about 256K scores per chunk).
    """
    if num_intervals < 1:
        raise ValueError(f"num_intervals must be >= 1, got {num_intervals}")
    if isinstance(categories, torch.Tensor):
        categories = DenseCategories(categories)
    if categories.shape != (len(queries), len(refs)):
        raise ValueError(
            f"categories must have shape {(len(queries), len(refs))}, got {tuple(categories.shape)}"
        )
    chunk_rows = rows_per_chunk(len(queries), len(refs), chunk_size)
    return PairHistogram.apply(
        queries,
        refs,
        categories,
        float(offset),
        float(scale),
        int(num_intervals),
        chunk_rows,
    )


def pair_categories(pos_mask: torch.Tensor, neg_mask: torch.Tensor) -> torch.Tensor:
    """int8 categories from boolean masks: 0 where ``pos_mask``, 1 where ``neg_mask``, else 2."""
    if (pos_mask & neg_mask).any():
        raise ValueError("a pair cannot be both positive and negative")
    # Arithmetic instead of masked assignment: two passes over N x M bytes, no index tensors.
    return (
        IGNORED
        - (IGNORED - POSITIVE) * pos_mask.to(torch.int8)
        - (IGNORED - NEGATIVE) * neg_mask.to(torch.int8)
    )
