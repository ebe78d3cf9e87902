"""The Triton kernels of :mod:`.triton_kernel` (which documents the design and the API).

Only defined when ``triton`` imports; ``TRITON_INTERPRET=1`` must be set before this module is
imported for them to run on CPU (``triton.jit`` reads it when decorating, not at launch).
Arguments shared by every kernel, in order: the six pointers (queries, refs, labels, ref_labels,
self_columns, dense categories; unused ones point anywhere, their branch is compiled out), the
kernel's own outputs, then ``n, m, d``, the strides, ``shift = offset + 1``, ``scale`` and the
split length.
The score tile ``Q R^T``, shared with the Ranked List kernel, is
:func:`~pml_rank_plugins.functional.triton_tiles.score_tile`.
"""

from __future__ import annotations

try:  # Triton is optional; the torch kernels stay the reference and the fallback.
    import triton
    import triton.language as tl
except ImportError:  # tested in-process by hiding the module
    triton = None

if triton is not None:
    # The Q R^T tile both fused kernels share; a kernel finds it in this module's globals.
    from ..triton_tiles import score_tile

    # Dense kernel signatures: black's one argument per line would double the module.
    # fmt: off

    @triton.jit
    def _categories(lab_ptr, rlab_ptr, self_ptr, cat_ptr, scn, scm, rows, cols, row_ok, col_ok,
                    DENSE: tl.constexpr, HAS_SELF: tl.constexpr):
        """Boolean ``(positive, negative)`` tiles: from the dense int8 categories (0 / 1; any
        other value ignored), or from the labels (equal: positive) with each row's
        ``self_columns`` entry ignored. Pairs outside the matrices are neither."""
        inside = row_ok[:, None] & col_ok[None, :]
        if DENSE:  # int64 row offsets: an (N, M) int8 input may pass 2^31 elements
            cat = tl.load(cat_ptr + rows[:, None].to(tl.int64) * scn + cols[None, :] * scm,
                          mask=inside, other=2)
            pos = cat == 0
            neg = cat == 1
        else:
            a = tl.load(lab_ptr + rows, mask=row_ok, other=0)
            b = tl.load(rlab_ptr + cols, mask=col_ok, other=0)
            same = a[:, None] == b[None, :]
            keep = inside
            if HAS_SELF:
                own = tl.load(self_ptr + rows, mask=row_ok, other=-1)
                keep = keep & (cols[None, :] != own[:, None])
            pos = same & keep
            neg = (a[:, None] != b[None, :]) & keep
        return pos, neg

    @triton.jit
    def _add_bin(v, posf, negf, hist_pos, hist_neg, bins, centre):
        """Adds the triangular kernel's weights at bin ``centre - 1`` (``v`` is shifted by one
        bin) into that column of the accumulators."""
        w = tl.maximum(1.0 - tl.abs(v - centre), 0.0)
        here = bins[None, :] == centre - 1
        hist_pos = tl.where(here, hist_pos + tl.sum(w * posf, axis=1)[:, None], hist_pos)
        hist_neg = tl.where(here, hist_neg + tl.sum(w * negf, axis=1)[:, None], hist_neg)
        return hist_pos, hist_neg

    @triton.jit
    def forward_kernel(q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr, out_ptr,
                        n, m, d, sqn, sqd, srm, srd, scn, scm, shift, scale, split_cols,
                        NUM_BINS: tl.constexpr, BLOCK_L: tl.constexpr, UNROLL: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                        DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                        PRECISION: tl.constexpr):
        """Partial histograms of rows ``[pid_0 BLOCK_N, +BLOCK_N)`` over the columns of split
        ``pid_1``, written to ``out[pid_1]`` (``(splits, N, 2, NUM_BINS)``)."""
        split = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < n
        bins = tl.arange(0, BLOCK_L)
        hist_pos = tl.zeros((BLOCK_N, BLOCK_L), dtype=tl.float32)
        hist_neg = tl.zeros((BLOCK_N, BLOCK_L), dtype=tl.float32)
        first = split * split_cols
        stop = tl.minimum(first + split_cols, m)
        for c0 in range(first, stop, BLOCK_M):
            cols = c0 + tl.arange(0, BLOCK_M)
            col_ok = cols < stop
            s = score_tile(q_ptr, r_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                           BLOCK_N, BLOCK_M, BLOCK_K, PRECISION)
            pos, neg = _categories(lab_ptr, rlab_ptr, self_ptr, cat_ptr, scn, scm, rows, cols,
                                   row_ok, col_ok, DENSE, HAS_SELF)
            # Bin units shifted by one bin as in the reference (u + 1 = scale s + offset + 1),
            # clamped to the centres' range [1, L + 1]: saturation into the end bins.
            v = tl.minimum(tl.maximum(s * scale + shift, 1.0), NUM_BINS * 1.0)
            posf = pos.to(tl.float32)
            negf = neg.to(tl.float32)
            if UNROLL:
                for centre in tl.static_range(1, NUM_BINS + 1):
                    hist_pos, hist_neg = _add_bin(v, posf, negf, hist_pos, hist_neg, bins, centre)
            else:
                for centre in range(1, NUM_BINS + 1):
                    hist_pos, hist_neg = _add_bin(v, posf, negf, hist_pos, hist_neg, bins, centre)
        at = out_ptr + (split * n + rows[:, None]) * (2 * NUM_BINS) + bins[None, :]
        ok = row_ok[:, None] & (bins[None, :] < NUM_BINS)
        tl.store(at, hist_pos, mask=ok)
        tl.store(at + NUM_BINS, hist_neg, mask=ok)

    @triton.jit
    def _accumulate_gradient(acc, q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr, slope_ptr,
                             rows, cols, row_ok, col_ok, dims, dim_ok, d, sqn, sqd, srm, srd,
                             scn, scm, shift, scale, NUM_BINS: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                             DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                             PRECISION: tl.constexpr, OF_QUERIES: tl.constexpr):
        """``acc + dS R[cols, dims]`` (``OF_QUERIES``) or ``acc + dS^T Q[rows, dims]`` for one
        tile: the one body of both gradient kernels (Triton inlines it). ``dS = dLoss/dS`` is
        recomputed: the slope table (already times ``scale``) read at each pair's category and
        bin interval; zero for ignored pairs and clamped values."""
        s = score_tile(q_ptr, r_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                       BLOCK_N, BLOCK_M, BLOCK_K, PRECISION)
        pos, neg = _categories(lab_ptr, rlab_ptr, self_ptr, cat_ptr, scn, scm, rows, cols,
                               row_ok, col_ok, DENSE, HAS_SELF)
        u = s * scale + shift  # shifted bin units, as in the forward
        # u < 1 (below the range, and NaN): clamped, no gradient; u >= L + 1 reads the table's
        # last column, 0. On [1, L + 1) truncation is floor: a centre takes the interval above.
        live = (pos | neg) & (u >= 1.0)
        interval = tl.minimum(u, NUM_BINS * 1.0).to(tl.int32) - 1
        at = rows[:, None] * (2 * NUM_BINS) + neg.to(tl.int32) * NUM_BINS + interval
        ds = tl.load(slope_ptr + at, mask=live, other=0.0)
        if OF_QUERIES:
            r = tl.load(r_ptr + cols[:, None] * srm + dims[None, :] * srd,
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = tl.dot(ds, r, acc, input_precision=PRECISION)
        else:
            q = tl.load(q_ptr + rows[:, None] * sqn + dims[None, :] * sqd,
                        mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = tl.dot(tl.trans(ds), q, acc, input_precision=PRECISION)
        return acc

    @triton.jit
    def grad_queries_kernel(q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr, slope_ptr,
                             out_ptr, n, m, d, sqn, sqd, srm, srd, scn, scm, shift, scale,
                             split_cols, NUM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                             DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                             PRECISION: tl.constexpr):
        """``out[pid_2, rows, dims] = dS[rows, split's columns] R[split's columns, dims]``."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        split = tl.program_id(2)
        row_ok = rows < n
        dim_ok = dims < d
        acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        first = split * split_cols
        stop = tl.minimum(first + split_cols, m)
        for c0 in range(first, stop, BLOCK_M):
            cols = c0 + tl.arange(0, BLOCK_M)
            acc = _accumulate_gradient(acc, q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                                       slope_ptr, rows, cols, row_ok, cols < stop, dims, dim_ok,
                                       d, sqn, sqd, srm, srd, scn, scm, shift, scale, NUM_BINS,
                                       BLOCK_N, BLOCK_M, BLOCK_K, DENSE, HAS_SELF, PRECISION, True)
        at = out_ptr + (split * n + rows[:, None]) * d + dims[None, :]
        tl.store(at, acc, mask=row_ok[:, None] & dim_ok[None, :])

    @triton.jit
    def grad_refs_kernel(q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr, slope_ptr,
                          out_ptr, n, m, d, sqn, sqd, srm, srd, scn, scm, shift, scale,
                          split_rows, NUM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                          DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                          PRECISION: tl.constexpr):
        """``out[pid_2, cols, dims] = dS[split's rows, cols]^T Q[split's rows, dims]``."""
        cols = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        split = tl.program_id(2)
        col_ok = cols < m
        dim_ok = dims < d
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        first = split * split_rows
        stop = tl.minimum(first + split_rows, n)
        for r0 in range(first, stop, BLOCK_N):
            rows = r0 + tl.arange(0, BLOCK_N)
            acc = _accumulate_gradient(acc, q_ptr, r_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                                       slope_ptr, rows, cols, rows < stop, col_ok, dims, dim_ok,
                                       d, sqn, sqd, srm, srd, scn, scm, shift, scale, NUM_BINS,
                                       BLOCK_N, BLOCK_M, BLOCK_K, DENSE, HAS_SELF, PRECISION,
                                       False)
        at = out_ptr + (split * m + cols[:, None]) * d + dims[None, :]
        tl.store(at, acc, mask=col_ok[:, None] & dim_ok[None, :])
    # fmt: on
