"""Soft histograms of pairwise scores by two-bin linear interpolation, fused with the similarity.

Both FastAP and mAP_Q histogram an affine function of the dot products ``S = Q R^T`` of
L2-normalized embeddings with a triangular kernel whose width equals the bin spacing ``delta``:
bin ``l`` (centre ``c_l``) receives ``max(0, 1 - |v - c_l| / delta)`` from a value ``v``. Such a
kernel is non-zero on at most the two centres around ``v``, with weights ``(1 - frac, frac)``,
``frac = v / delta - floor(v / delta)``; scattering those two weights gives *exactly* the dense
``L``-bin histogram in O(N M) instead of O(L N M) (FastAP paper eq. 9-10; Revaud et al. eq. 7).

Values are expressed in bin units, ``u = offset + scale * S``; values outside ``[0, L]`` saturate
into the end bins (and get no gradient there).

Every pair ``(i, j)`` carries a category: 0 = positive, 1 = negative, 2 = ignored (self pair,
unmined pair). The output is ``(N, 2, L + 1)``: positive and negative histograms per query.

Categories come from a *source* with ``rows(start, stop)``: :class:`DenseCategories` wraps an
``(N, M)`` int8 tensor (pairs from a miner), :class:`LabelCategories` derives each chunk's
categories from the labels (same label = positive, else negative, self pair ignored), so no
float or int64 N x M tensor is ever materialized.

Memory and time: forward computes each query chunk's scores in reused buffers, scatters them, and
keeps for backward one small integer per pair, its histogram column (one byte for up to 82
intervals). Backward reads the histogram gradient's slope at those columns with a gather (by
row blocks for the query gradient, by column blocks for the reference gradient, so that no two
chunks add into the same output rows) and needs no recomputation. Chunks run on threads
(:mod:`~pml_rank_plugins.functional.chunk_threads`), each with its own buffers. A chunk wider than
``2 * CACHE_CHUNK_ELEMENTS`` pairs (a batch against a large memory bank) is processed in column
blocks of about ``CACHE_CHUNK_ELEMENTS`` pairs (:func:`column_block`), so its elementwise passes
stay in cache; each row scatters into ``_LANES`` interleaved copies of its columns, so that
consecutive pairs in the same bin do not wait on each other. Peak extra memory is
O(threads * chunk * min(M, block)) floats (a few buffers of that size per thread) + O(threads *
chunk * M) bytes of chunk categories + N M bytes of codes (+ N M bytes of dense categories with a
miner), independent of ``L``; time three O(N M d) products (scores;
both gradients) plus O(N M) elementwise work (two scatters in forward, one gather per gradient in
backward, a handful of in-cache passes).

Convention at kinks: a value exactly on a bin centre gets the slope of the interval above it;
clamped values (outside the range) get zero.
"""

from __future__ import annotations

import torch

from ..chunk_threads import (
    ExclusiveRows,
    chunk_workers,
    glue_elements,
    map_chunks,
    one_torch_thread,
)
from ..chunking import (  # noqa: F401 (re-exported: the chunking helpers used to live here)
    CACHE_CHUNK_ELEMENTS,
    IGNORED,
    MAX_CHUNK_ELEMENTS,
    MIN_CHUNK_ROWS,
    NEGATIVE,
    POSITIVE,
    DenseCategories,
    LabelCategories,
    rows_per_chunk,
)

# scatter_add_ adds a row's pairs one after the other; when consecutive pairs fall in the same
# column (most pairs are negatives whose scores crowd into one or two bins), each add waits for
# the previous one. Spreading consecutive pairs over _LANES copies of the columns, summed at the
# end, breaks those chains (one thread, 64 x 65,536 pairs of random unit vectors: 3.4 ms ->
# 1.9 ms per scatter; 8 copies were no faster than 4).
_LANES = 4
# The narrowest column block of a wide chunk (see column_block).
MIN_BLOCK_COLUMNS = 4096


def _code_dtype(max_code: int) -> torch.dtype:
    """Smallest integer dtype holding column codes up to ``max_code``."""
    if max_code < 256:
        return torch.uint8
    return torch.int16 if max_code < 1 << 15 else torch.int32


class PairHistogram(torch.autograd.Function):
    """``(N, 2, L + 1)`` positive/negative soft histograms of ``offset + scale * Q R^T``.

    Inputs: ``queries`` (N, d), ``refs`` (M, d), ``categories`` a category source (rows of
    int8 in {0, 1, 2}), ``offset``, ``scale`` (floats), ``num_intervals`` L >= 1,
    ``chunk_rows`` (rows per chunk). Differentiable w.r.t. ``queries`` and ``refs`` (pass the
    same tensor twice for self-ranking).

    Column layout: each category owns a segment of ``W = L + 3`` columns, the ``L + 1`` bins with
    one saturation column on each side. A value is shifted by one bin and clamped to
    ``[0.5, L + 1.5]``, so an out-of-range value splits its unit weight between a saturation
    column and the end bin; folding the saturation columns into the end bins afterwards gives
    exactly the clamped histogram. In backward the saturation columns carry the end bins'
    gradient, so the derivative ``g[c + 1] - g[c]`` read at a clamped pair's column is zero
    without any mask. Per pair, only its column (one byte for L <= 82) is kept for backward.
    """

    @staticmethod
    def forward(ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows):
        with one_torch_thread(queries.device, glue_elements(queries, refs)):
            return PairHistogram._forward(
                ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows
            )

    @staticmethod
    def _forward(ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows):
        n, m = len(queries), len(refs)
        width = num_intervals + 3
        # Ignored pairs land in a third segment that is dropped; one spare column for ``c + 1``.
        # Each row accumulates into _LANES copies of its 3 * width columns, pair j into copy
        # j % _LANES (see _LANES), summed at the end.
        out = queries.new_zeros(n, _LANES * 3 * width)
        minus_left = torch.zeros_like(out)
        lane = (torch.arange(m, device=queries.device, dtype=torch.int32) % _LANES) * (3 * width)
        lane = lane.unsqueeze(0)
        codes = torch.empty(n, m, dtype=_code_dtype(3 * width - 2), device=queries.device)
        starts = range(0, n, chunk_rows)
        workers = chunk_workers(len(starts), queries.device)
        source = ExclusiveRows(categories, workers)
        # Column blocks keep a chunk's elementwise passes in cache when M is large (a batch
        # against a memory bank): see column_block.
        block = column_block(min(chunk_rows, n), m)
        # Per-worker chunk buffers, allocated once: reused memory stays mapped and in cache.
        buffers = [_ForwardBuffers(min(chunk_rows, n) * block, queries) for _ in range(workers)]
        shift = queries.new_tensor(offset + 1.0)

        def chunk(index: int, worker: int) -> None:
            start = starts[index]
            stop = min(start + chunk_rows, n)
            rows = stop - start
            buf = buffers[worker]
            cat = source.rows(start, stop, worker)
            # A row's pairs are scattered block after block, in column order: the additions of
            # one pass over the row, in its order (a block's product may round differently from
            # the whole row's in the last bit).
            for first in range(0, m, block):
                last = min(first + block, m)
                u, column, index_, small_index = buf.views(rows, last - first)
                torch.addmm(shift, queries[start:stop], refs[first:last].T, alpha=scale, out=u)
                u.clamp_(0.5, num_intervals + 1.5)
                torch.floor(u, out=column)
                frac = u.sub_(column)
                column.add_(cat[:, first:last], alpha=width)
                # float -> int32 -> int64 is faster than float -> int64 in one conversion, and
                # the int32 copy narrows cheaply into the codes; scatter_add_ is fastest on int64.
                small_index.copy_(column)
                codes[start:stop, first:last] = small_index
                index_.copy_(small_index.add_(lane[:, first:last]))
                out[start:stop, 1:].scatter_add_(1, index_, frac)
                # The left column's weight 1 - frac is accumulated negated (frac - 1, one
                # in-place pass, no extra buffer) and subtracted once at the end.
                minus_left[start:stop].scatter_add_(1, index_, frac.sub_(1.0))

        map_chunks(chunk, len(starts), workers)
        out = out.view(n, _LANES, 3 * width).sum(1)
        out.sub_(minus_left.view(n, _LANES, 3 * width).sum(1))
        ctx.save_for_backward(queries, refs, codes)
        ctx.params = (scale, num_intervals, chunk_rows)
        segments = out[:, : 2 * width].view(n, 2, width)
        segments[:, :, 1] += segments[:, :, 0]
        segments[:, :, num_intervals + 1] += segments[:, :, num_intervals + 2]
        return segments[:, :, 1 : num_intervals + 2].contiguous()

    @staticmethod
    def backward(ctx, grad_hist):
        queries, refs, _ = ctx.saved_tensors
        with one_torch_thread(grad_hist.device, glue_elements(queries, refs)):
            return PairHistogram._backward(ctx, grad_hist)

    @staticmethod
    def _backward(ctx, grad_hist):
        queries, refs, codes = ctx.saved_tensors
        scale, num_intervals, chunk_rows = ctx.params
        n, m = len(queries), len(refs)
        width = num_intervals + 3
        grad = grad_hist.new_zeros(n, 3, width)
        grad[:, :2, 1 : num_intervals + 2] = grad_hist
        grad[:, :2, 0] = grad_hist[:, :, 0]
        grad[:, :2, num_intervals + 2] = grad_hist[:, :, num_intervals]
        grad = grad.view(n, 3 * width)
        # d(frac)/du = 1 and d(1 - frac)/du = -1: a pair at column c has dL/du = g[c + 1] - g[c].
        slope = (grad[:, 1:] - grad[:, :-1]).mul_(scale)
        grad_queries = grad_refs = None
        if ctx.needs_input_grad[0]:
            # Row blocks: grad_q[rows] = G[rows] R.
            grad_queries = torch.empty_like(queries)
            _pair_gradient(slope, codes, refs, grad_queries, chunk_rows, by_rows=True)
        if ctx.needs_input_grad[1]:
            # Column blocks: grad_r[cols] = G[:, cols]^T Q. Each block owns its output rows, so the
            # chunks run in any order without a cross-chunk sum (deterministic under threads),
            # at the price of reading the codes twice.
            grad_refs = torch.empty_like(refs)
            column_rows = rows_per_chunk(m, n)
            _pair_gradient(slope, codes, queries, grad_refs, column_rows, by_rows=False)
        return grad_queries, grad_refs, None, None, None, None, None


class _ForwardBuffers:
    """One worker's flat buffers of :meth:`PairHistogram.forward`, ``size`` elements each, viewed
    as each column block's ``(rows, columns)``."""

    def __init__(self, size: int, like: torch.Tensor):
        self.scores, self.column = like.new_empty(size), like.new_empty(size)
        self.index = torch.empty(size, dtype=torch.long, device=like.device)
        self.small_index = torch.empty(size, dtype=torch.int32, device=like.device)

    def views(self, rows: int, cols: int) -> tuple[torch.Tensor, ...]:
        """``(scores, column, index, small_index)`` viewed as ``(rows, cols)`` (contiguous)."""
        buffers = (self.scores, self.column, self.index, self.small_index)
        return tuple(b[: rows * cols].view(rows, cols) for b in buffers)


def column_block(rows: int, cols: int) -> int:
    """Columns per block of a ``rows``-row chunk: all ``cols`` while the chunk holds at most
    ``2 * CACHE_CHUNK_ELEMENTS`` pairs, else enough for about ``CACHE_CHUNK_ELEMENTS`` (at least
    ``MIN_BLOCK_COLUMNS``, so each block's product stays large)."""
    if rows * cols <= 2 * CACHE_CHUNK_ELEMENTS:
        return max(cols, 1)
    return min(cols, max(CACHE_CHUNK_ELEMENTS // max(rows, 1), MIN_BLOCK_COLUMNS))


def _pair_gradient(slope, codes, other, out, block, by_rows: bool) -> None:
    """``out = G other`` (``by_rows``) or ``out = G^T other``, ``G[i, j] = slope[i, codes[i, j]]``
    gathered one block of ``block`` rows (or columns) of ``G`` at a time, blocks spread over
    :func:`map_chunks` threads."""
    n, m = codes.shape
    total = n if by_rows else m
    starts = range(0, total, block)
    workers = chunk_workers(len(starts), codes.device)
    # Row blocks of a wide G are gathered and multiplied by column blocks (see column_block),
    # accumulated in column order.
    cols = column_block(min(block, total), m) if by_rows else n
    # Flat buffers, viewed per block: a narrower last block stays contiguous.
    size = min(block, total) * cols
    index_bufs = [torch.empty(size, dtype=torch.long, device=codes.device) for _ in range(workers)]
    grad_bufs = [slope.new_empty(size) for _ in range(workers)]

    def view(worker: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        size = shape[0] * shape[1]
        return index_bufs[worker][:size].view(shape), grad_bufs[worker][:size].view(shape)

    def chunk(index: int, worker: int) -> None:
        start = starts[index]
        stop = min(start + block, total)
        if by_rows:
            for first in range(0, m, cols):
                last = min(first + cols, m)
                index_, grad_scores = view(worker, (stop - start, last - first))
                index_.copy_(codes[start:stop, first:last])
                torch.gather(slope[start:stop], 1, index_, out=grad_scores)
                if first == 0:
                    torch.mm(grad_scores, other[first:last], out=out[start:stop])
                else:
                    out[start:stop].addmm_(grad_scores, other[first:last])
        else:
            index_, grad_scores = view(worker, (n, stop - start))
            index_.copy_(codes[:, start:stop])
            torch.gather(slope, 1, index_, out=grad_scores)
            torch.mm(grad_scores.T, other, out=out[start:stop])

    map_chunks(chunk, len(starts), workers)


# A graph break under torch.compile: the chunk loop is a host program (threads, set_num_threads,
# aliasing reused buffers), not traced (see the chunk_threads module docstring).
@torch.compiler.disable
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
            source (``LabelCategories``, ``DenseCategories`` of ``functional.chunking``).
        offset, scale: the histogrammed value in bin units is ``offset + scale * q.r``.
        num_intervals: ``L``, the number of bin spacings; there are ``L + 1`` bin centres.
        chunk_size: query rows per chunk (``None``: ``chunking.rows_per_chunk`` decides).
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
