"""Soft histograms of pairwise scores for an accelerator: few large chunks, no host sync.

The same mathematics and the same values (to float rounding) as
:func:`pml_rank_plugins.functional.histogram.cpu.pair_histograms`: the ``(N, 2, L + 1)``
positive/negative histograms of ``u = offset + scale * Q R^T`` with the two-bin triangular
kernel, values outside ``[0, L]`` saturating into the end bins with zero gradient, and at a kink
(a value exactly on a bin centre) the slope of the interval above it. Written for a GPU:

* **Chunks from a fixed budget.** Query rows per chunk come from
  :func:`~pml_rank_plugins.functional.chunking.rows_per_chunk` with
  ``bytes_per_pair = 2 * itemsize + 9`` (the scores, the gathered gradient in backward, the int64
  bin column and the chunk's categories; float32: 17 bytes): at N = M = 4096 one chunk. The number is
  decided once in forward and reused by backward.
* **No host synchronisation**, forward or backward: no ``nonzero``, boolean indexing,
  ``.item()``, ``unique``; every shape is known on the host before the data exist.
* **Recomputation instead of storage.** Backward recomputes each chunk's bin columns from
  ``Q R^T`` (one more product per chunk) instead of keeping an ``N x M`` code per pair, so the
  extra memory is the chunk buffers alone, within the budget, at any N. Exception: one chunk
  of at most :data:`SAVED_INDEX_PAIRS` pairs (16 MiB of columns) keeps its columns, since there
  the host time of the eight recomputing operators is what costs (issue 39).
* **Few operators.** The saturation columns are folded into the end bins, and the slope of
  each column taken, by one product with a small constant matrix each (see
  :func:`_constants`); a chunk is six elementwise operators and two scatters (forward), or five
  and one gather and two products (backward): about 35 dispatched operators per forward +
  backward at one chunk.

Column layout (as in ``cpu.PairHistogram``): a category owns ``W = L + 3`` columns,
the ``L + 1`` bins with a saturation column on each side; a value is shifted by one bin and
clamped to ``[0.5, L + 1.5]``, so a clamped value splits its unit weight between a saturation
column and its end bin, and its slope ``g[c + 1] - g[c]`` is zero since the saturation column
carries the end bin's gradient. Pair ``(i, j)`` of category ``k`` (0 positive, 1 negative, 2
ignored) lands in column ``k W + floor(u')`` of query ``i``'s row; the ignored segment is dropped.

Time: three ``O(N M d)`` products (forward, and in backward the recomputation and the two
gradients fused per chunk: four in all) + ``O(N M)`` elementwise work. Memory: the chunk buffers
(``rows * M * bytes_per_pair``) + ``O(N L)``.

Determinism: each gradient is accumulated chunk after chunk in a fixed order (no cross-chunk
atomics). ``scatter_add_`` on CUDA adds with atomics (last-bit differences between runs) unless
``torch.use_deterministic_algorithms(True)`` is set, under which torch uses its deterministic
(sorting) implementation; CPU results are deterministic. ``float32_matmul`` pins the products
to IEEE float32 on CUDA (no TF32), forward and backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..chunking import IGNORED, DenseCategories, LabelCategories, rows_per_chunk
from ..eager_cache import eager_lru_cache

# Up to this many pairs (16 MiB of int64 columns: N = M = 1448) a one-chunk forward keeps its
# bin columns for backward instead of recomputing them: eight operators fewer per call where
# the loss is host-bound (small N), no memory that matters; beyond, recomputation.
SAVED_INDEX_PAIRS = 1 << 21


def bytes_per_pair(dtype: torch.dtype) -> int:
    """Bytes of chunk buffers per (query, reference) pair: the scores, the gathered gradient
    (backward), an int64 bin column and one category byte."""
    return 2 * dtype.itemsize + 9


@contextlib.contextmanager
def float32_matmul(device: torch.device) -> Iterator[None]:
    """Run the enclosed float32 products in IEEE float32 on CUDA (``torch.backends.cuda.matmul.
    fp32_precision = "ieee"``, the torch >= 2.9 API; the previous value restored after). TF32
    rounds ``Q R^T`` to about 1e-3, which moves pairs across bin boundaries. Elsewhere (CPU, and
    the meta device) a no-op: no global setting is touched. Only the new API is read and written,
    so a process that set the legacy ``allow_tf32`` flag keeps reading it without torch's
    mixed-API error.

    Under ``torch.compile`` a no-op too: a graph cannot set the flag (dynamo refuses to read or
    write ``fp32_precision``, "Attempted to call function marked as skipped": a graph break on
    CUDA), so the compiled products run at the process's float32 matmul precision when the
    graph runs: IEEE by default (``fp32_precision`` ``"none"``), TF32 after
    ``torch.set_float32_matmul_precision("high")``, where the compiled histograms differ from
    eager by the pairs moved across bin edges (``backend="triton"`` sets its own precision)."""
    if torch.device(device).type != "cuda" or torch.compiler.is_compiling():
        yield
        return
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    if saved == "ieee":
        yield
        return
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = saved


class LabelPairs(LabelCategories):
    """:class:`~pml_rank_plugins.functional.chunking.LabelCategories` without its host sync: the
    labels are compared as given (no ``torch.unique`` to dense ids). Same categories: 0 where the
    labels match, 1 where they differ, 2 at ``self_columns[i]``, or on the diagonal with
    ``diagonal=True`` (the batch against itself: no index tensor needed). ``rows`` reuses no
    buffer: each chunk gets a fresh ``(rows, M)`` byte tensor, within the chunk budget."""

    def __init__(
        self,
        labels: torch.Tensor,
        ref_labels: torch.Tensor,
        self_columns: torch.Tensor | None = None,
        diagonal: bool = False,
    ):
        if diagonal and self_columns is not None:
            raise ValueError("pass self_columns or diagonal=True, not both")
        self.shape = (len(labels), len(ref_labels))
        self.labels, self.ref_labels = labels, ref_labels
        self._column, self._ref_row = labels.view(-1, 1), ref_labels.view(1, -1)
        self._self_columns, self.diagonal = self_columns, diagonal
        self.device = labels.device
        self._ignored_index = None
        if self_columns is not None:
            self._rows = torch.arange(len(labels), device=labels.device)

    @property
    def self_columns(self) -> torch.Tensor | None:
        """``(N,)`` int64 column ignored in each query's row (``arange`` for the diagonal)."""
        if self.diagonal:
            return torch.arange(self.shape[0], device=self.device)
        return self._self_columns

    def rows(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``[start, stop)`` as a new ``(stop - start, M)`` int8 tensor (``out`` unused)."""
        whole = start == 0 and stop == self.shape[0]
        labels = self._column if whole else self._column[start:stop]
        # bool -> int8 reinterprets the bytes (0/1) instead of converting them.
        categories = torch.ne(labels, self._ref_row).view(torch.int8)
        if self.diagonal:
            categories.diagonal(start).fill_(IGNORED)
        elif self._self_columns is not None:
            rows = self._rows if whole else self._rows[: stop - start]
            columns = self._self_columns if whole else self._self_columns[start:stop]
            ignored = torch.full((), IGNORED, dtype=torch.int8, device=self.device)
            categories.index_put_((rows, columns), ignored)
        return categories

    def add_columns(self, index: torch.Tensor, start: int, stop: int, width: int) -> None:
        """``index += width * category`` for rows ``[start, stop)``, in place, the ignored pairs
        moved to column ``2 width`` (the start of the dropped segment): the columns
        :func:`_chunk_columns` needs, without the int8 category tensor of :meth:`rows` (two
        operators fewer per pass, and no int8 -> int64 conversion)."""
        whole = start == 0 and stop == self.shape[0]
        labels = self._column if whole else self._column[start:stop]
        index.add_(torch.ne(labels, self._ref_row), alpha=width)
        if self.diagonal:
            index.diagonal(start).fill_(IGNORED * width)
        elif self._self_columns is not None:
            rows = self._rows if whole else self._rows[: stop - start]
            columns = self._self_columns if whole else self._self_columns[start:stop]
            index.index_put_((rows, columns), self._ignored_column(width))

    def _ignored_column(self, width: int) -> torch.Tensor:
        """The 0-dim int64 ``IGNORED * width``, made once per source and width (eager; under
        ``torch.compile`` made in the graph: a tensor cached on this object from inside the
        traced ``autograd.Function`` is a side effect dynamo refuses)."""
        if torch.compiler.is_compiling():
            return torch.full((), IGNORED * width, dtype=torch.long, device=self.device)
        cached = self._ignored_index
        if cached is None or cached[0] != width:
            value = torch.full((), IGNORED * width, dtype=torch.long, device=self.device)
            cached = self._ignored_index = (width, value)
        return cached[1]


@eager_lru_cache(maxsize=64)  # under torch.compile built in the graph (eager_cache)
def _constants(num_intervals: int, offset: float, scale: float, dtype, device):
    """``(shift, fold, slope)`` for ``L = num_intervals`` bins (built from Python values: no
    device data is read; a few KiB each).

    * ``shift``: the 0-dim ``offset + 1`` (values are shifted by one bin, see the layout).
    * ``fold``: ``(6 W, 2 (L + 1))``. The forward accumulates the right weights ``frac`` in
      columns ``[0, 3 W)`` and the left weights negated (``frac - 1``) in ``[3 W, 6 W)``;
      ``acc @ fold`` subtracts the second half from the first, folds each saturation column into
      its end bin and drops the ignored segment. Entries 0/+-1, one per (column, half) and row
      pair: exact sums of two terms.
    * ``slope``: ``(2 (L + 1), 3 W - 1)``: ``grad_hist @ slope`` is ``scale (g[c + 1] - g[c])``
      with ``g`` each column's gradient (a saturation column's is its end bin's), the derivative
      of the histogram at a pair in column ``c``. A clamped pair's column has two equal
      gradients: its column of ``slope`` is exactly zero, so its gradient is exactly zero.
    """
    width = num_intervals + 3
    # spread[b, c] = 1 where column c (of the positive and negative segments) holds bin b.
    # One index assignment, not a Python loop: under torch.compile this builder is traced.
    spread = torch.zeros(2 * (num_intervals + 1), 3 * width, dtype=torch.float64)
    bins = (torch.arange(width) - 1).clamp_(0, num_intervals)
    spread[torch.cat([bins, bins + num_intervals + 1]), torch.arange(2 * width)] = 1.0
    fold = torch.cat([spread.T, -spread.T])
    slope = (spread[:, 1:] - spread[:, :-1]) * scale
    shift = torch.tensor(offset + 1.0, dtype=dtype)
    return tuple(t.to(device=device, dtype=dtype) for t in (shift, fold, slope))


class GpuPairHistogram(torch.autograd.Function):
    """``(N, 2, L + 1)`` histograms; see the module docstring. Inputs as
    ``cpu.PairHistogram``: ``queries`` (N, d), ``refs`` (M, d) or ``None`` for self-ranking
    (the batch against itself: then the one gradient ``G R + G^T Q`` goes to ``queries``), a
    category source, ``offset``, ``scale``, ``num_intervals``, ``chunk_rows``. Self-ranking is
    ``None`` rather than the same tensor twice because ``torch.compile`` cannot trace an
    ``autograd.Function`` given one tensor as two inputs ("duplicate tensor input", a graph
    break)."""

    @staticmethod
    def forward(ctx, queries, refs, categories, offset, scale, num_intervals, chunk_rows):
        is_self = refs is None
        refs = queries if is_self else refs
        n = len(queries)
        width = num_intervals + 3
        shift, fold, _ = _constants(num_intervals, offset, scale, queries.dtype, queries.device)
        with float32_matmul(queries.device):
            refs_t = refs.T
            acc = queries.new_zeros(n, 6 * width)
            saved_index = None
            for start in range(0, n, chunk_rows):
                stop = min(start + chunk_rows, n)
                acc_rows = acc if start == 0 and stop == n else acc[start:stop]
                frac, index = _chunk_columns(
                    queries, refs_t, categories, start, stop, shift, scale, num_intervals, True
                )
                # Right weight frac at column c + 1; left weight 1 - frac, negated, at 3 W + c.
                acc_rows[:, 1:].scatter_add_(1, index, frac)
                acc_rows[:, 3 * width :].scatter_add_(1, index, frac.sub_(1.0))
                if stop - start == n and index.numel() <= SAVED_INDEX_PAIRS:
                    saved_index = index  # one small chunk: backward reuses its columns
            hist = torch.mm(acc, fold)
        # Tensors go through save_for_backward (the saved columns too, an intermediate):
        # torch.compile refuses a tensor made in forward and kept as a ctx attribute.
        ctx.save_for_backward(queries, None if is_self else refs, saved_index)
        ctx.categories = categories
        ctx.params = (offset, scale, num_intervals, chunk_rows, is_self)
        return hist.view(n, 2, num_intervals + 1)

    @staticmethod
    def backward(ctx, grad_hist):
        offset, scale, num_intervals, chunk_rows, is_self = ctx.params
        queries, refs, saved_index = ctx.saved_tensors
        if is_self:  # one tensor: G R + G^T Q, from the row and the column pass
            refs = queries
            need_q = need_r = ctx.needs_input_grad[0]
        else:
            need_q, need_r = ctx.needs_input_grad[:2]
        n = len(queries)
        shift, _, slope_of = _constants(num_intervals, offset, scale, queries.dtype, queries.device)
        grad_queries = grad_refs = None
        with float32_matmul(queries.device):
            slope = torch.mm(grad_hist.reshape(n, -1).to(queries.dtype), slope_of)
            for start in range(0, n, chunk_rows):
                stop = min(start + chunk_rows, n)
                whole = start == 0 and stop == n
                index = saved_index
                if index is None:  # recomputed: the same operations as forward
                    _, index = _chunk_columns(
                        queries,
                        refs.T,
                        ctx.categories,
                        start,
                        stop,
                        shift,
                        scale,
                        num_intervals,
                        False,
                    )
                grad_scores = torch.gather(slope if whole else slope[start:stop], 1, index)
                rows = queries if whole else queries[start:stop]
                part = torch.mm(grad_scores, refs) if need_q else None
                if is_self and whole and part is not None:
                    # One chunk of the batch against itself: both passes in one product.
                    grad = torch.addmm(part, grad_scores.T, rows)
                    return grad, None, None, None, None, None, None
                if part is not None:
                    if whole:
                        grad_queries = part
                    else:
                        if grad_queries is None:
                            grad_queries = queries.new_empty(queries.shape)
                        grad_queries[start:stop] = part
                if need_r:
                    # Chunk after chunk into one buffer: a fixed order, no atomics.
                    if grad_refs is None:
                        grad_refs = torch.mm(grad_scores.T, rows)
                    else:
                        grad_refs.addmm_(grad_scores.T, rows)
        if is_self and grad_queries is not None:
            return grad_queries.add_(grad_refs), None, None, None, None, None, None
        return grad_queries, grad_refs, None, None, None, None, None


def _chunk_columns(queries, refs_t, categories, start, stop, shift, scale, num_intervals, frac):
    """``(frac, index)`` of the chunk's pairs: ``index`` the int64 histogram column (category
    segment included) of each pair, ``frac`` (only if asked, else ``None``) its right weight.
    Forward and backward compute the columns with the same operations, so the same columns."""
    whole = start == 0 and stop == len(queries)
    u = torch.addmm(shift, queries if whole else queries[start:stop], refs_t, alpha=scale)
    u.clamp_(0.5, num_intervals + 1.5)
    # Truncation is the floor here (u >= 0.5); no float copy of the columns is needed. A NaN
    # (from NaN embeddings, unchecked on this path) survives the clamp and converts to an
    # arbitrary integer: clamping the integer keeps every index in range, and the NaN weight
    # carries on into the histograms and the loss, where the caller sees it.
    index = u.long().clamp_(0, num_intervals + 1)
    right = u.sub_(index) if frac else None
    if isinstance(categories, LabelPairs):
        categories.add_columns(index, start, stop, num_intervals + 3)
    else:
        index.add_(categories.rows(start, stop), alpha=num_intervals + 3)
    return right, index


def pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories,
    offset: float,
    scale: float,
    num_intervals: int,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Positive/negative soft histograms, ``(N, 2, num_intervals + 1)``, on any device without a
    host sync; the arguments and values of
    :func:`pml_rank_plugins.functional.histogram.cpu.pair_histograms`.

    Args:
        queries: ``(N, d)`` L2-normalized query embeddings (float32 or float64).
        refs: ``(M, d)`` reference embeddings of the same dtype and device (may be ``queries``).
        categories: ``(N, M)`` int8 tensor (0 positive, 1 negative, 2 ignored) or a category
            source (:class:`LabelPairs`, ``chunking.LabelCategories`` / ``DenseCategories``).
        offset, scale: the histogrammed value in bin units is ``offset + scale * q.r``.
        num_intervals: ``L`` >= 1; there are ``L + 1`` bin centres.
        chunk_size: query rows per chunk (``None``: the GPU budget rule of
            ``chunking.rows_per_chunk`` with :func:`bytes_per_pair`).

    Raises:
        ValueError: for a non-2-D or non-floating input, mismatched widths, dtypes or devices,
            categories of the wrong shape, or ``num_intervals < 1``. Reads no tensor value.
    """
    check_pair_inputs(queries, refs, categories, num_intervals)
    if isinstance(categories, torch.Tensor):
        categories = DenseCategories(categories)
    chunk_rows = rows_per_chunk(
        len(queries),
        len(refs),
        chunk_size,
        bytes_per_pair=bytes_per_pair(queries.dtype),
        device=queries.device,
    )
    return GpuPairHistogram.apply(
        queries,
        None if refs is queries else refs,
        categories,
        float(offset),
        float(scale),
        int(num_intervals),
        chunk_rows,
    )


def check_pair_inputs(queries, refs, categories, num_intervals: int) -> None:
    """Shape, dtype and device checks of the histogram kernels' inputs (no value is read)."""
    if num_intervals < 1:
        raise ValueError(f"num_intervals must be >= 1, got {num_intervals}")
    for name, x in (("queries", queries), ("refs", refs)):
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.dtype.is_floating_point:
            got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, torch.Tensor) else x
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got {got}")
    if refs.shape[1] != queries.shape[1]:
        raise ValueError(f"refs have {refs.shape[1]} columns, queries {queries.shape[1]}")
    if refs.dtype != queries.dtype or refs.device != queries.device:
        raise ValueError(
            f"queries ({queries.dtype}, {queries.device}) and refs ({refs.dtype}, "
            f"{refs.device}) must share dtype and device"
        )
    if tuple(categories.shape) != (len(queries), len(refs)):
        raise ValueError(
            f"categories must have shape {(len(queries), len(refs))}, got {tuple(categories.shape)}"
        )
    if isinstance(categories, torch.Tensor) and categories.dtype.is_floating_point:
        raise ValueError(f"categories must be an integer tensor (0, 1, 2), got {categories.dtype}")
