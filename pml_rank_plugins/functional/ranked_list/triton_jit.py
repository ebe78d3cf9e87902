"""The Triton kernels of :mod:`.triton_kernel` (which documents the design, the API and the
row-statistics layout).

Only defined when ``triton`` imports; ``TRITON_INTERPRET=1`` must be set before this module is
imported for them to run on CPU (``triton.jit`` reads it when decorating, not at launch).
Arguments shared by every kernel, in order: the nine input pointers (queries, refs, their
squared norms, labels, ref_labels, self_columns, dense categories, dense miner weights; unused
ones point anywhere, their branch is compiled out), the kernel's own pointers, then
``n, m, d``, the strides, ``alpha``, ``thr = alpha - margin``, ``Tn``, ``Tp`` and the split
length.
The score tile ``Q R^T``, shared with the histogram kernel, is
:func:`~pml_rank_plugins.functional.triton_tiles.score_tile`.
"""

from __future__ import annotations

try:  # Triton is optional; the torch kernels stay the reference and the fallback.
    import triton
    import triton.language as tl
except ImportError:  # tested in-process by hiding the module
    triton = None

# Rows of the (10, N) statistics: positive extreme, Z+, S+, count+, negative extreme (the
# smallest mined distance, or the largest miner weight), Z-, S-, count-, and with a miner's
# weights under "weight_share" the Tn extreme and Tn weight sum of the mined negatives.
NUM_STATS = 10

if triton is not None:
    # The Q R^T tile both fused kernels share; a kernel finds it in this module's globals.
    from ..triton_tiles import score_tile

    # Dense kernel signatures: black's one argument per line would double the module.
    # fmt: off

    @triton.jit
    def _scaled_exp(x, T):
        """``exp(T x)`` with ``exp(T 0) = 1`` also when ``T`` is ``inf`` (a temperature above
        float32's range: the hardest-pair limit, as ``reference.scaled_exp_``)."""
        zero = x == 0.0
        return tl.where(zero, 1.0, tl.exp(tl.where(zero, -1.0, x) * T))

    @triton.jit
    def _masked_exp(mask, x, T):
        """``exp(T x)`` on ``mask``, 0 elsewhere; off the mask the exponent is never formed (no
        overflow, no ``inf * 0`` in the products that follow)."""
        return tl.where(mask, _scaled_exp(tl.where(mask, x, 0.0), T), 0.0)

    @triton.jit
    def _mined(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr, rows, cols,
               row_ok, col_ok, d, sqn, sqd, srm, srd, scn, scm, alpha, thr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               DENSE: tl.constexpr, HAS_SELF: tl.constexpr, DIAGONAL: tl.constexpr,
               PRECISION: tl.constexpr):
        """``(dist, pos, neg)`` of one tile: the Euclidean distances
        ``sqrt(max(0, (|q|^2 - 2 q.r) + |r|^2))`` (the operations of ``cpu_steps.mine_chunk``)
        and RLL's non-trivial pairs ``pos & (d > thr)``, ``neg & (d < alpha)``. Candidates from
        the dense int8 categories (0 / 1, any other value ignored) or from the labels (equal:
        positive) with each row's own column (``self_columns``, or the diagonal) ignored.
        Pairs outside the matrices are neither."""
        s = score_tile(q_ptr, r_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                       BLOCK_N, BLOCK_M, BLOCK_K, PRECISION)
        qsq = tl.load(qsq_ptr + rows, mask=row_ok, other=0.0)
        rsq = tl.load(rsq_ptr + cols, mask=col_ok, other=0.0)
        # NaN propagates (as torch's clamp_min): a non-finite embedding makes the loss NaN, the
        # signal the trainers' check reads, instead of vanishing into an unmined pair.
        square = (qsq[:, None] - 2.0 * s) + rsq[None, :]
        dist = tl.sqrt(tl.maximum(square, 0.0, propagate_nan=tl.PropagateNan.ALL))
        inside = row_ok[:, None] & col_ok[None, :]
        if DENSE:  # int64 row offsets: an (N, M) input may pass 2^31 elements
            cat = tl.load(cat_ptr + rows[:, None].to(tl.int64) * scn + cols[None, :] * scm,
                          mask=inside, other=2)
            pos = cat == 0
            neg = cat == 1
        else:
            a = tl.load(lab_ptr + rows, mask=row_ok, other=0)
            b = tl.load(rlab_ptr + cols, mask=col_ok, other=0)
            keep = inside
            if HAS_SELF:
                own = tl.load(self_ptr + rows, mask=row_ok, other=-1)
                keep = keep & (cols[None, :] != own[:, None])
            if DIAGONAL:
                keep = keep & (cols[None, :] != rows[:, None])
            pos = (a[:, None] == b[None, :]) & keep
            neg = (a[:, None] != b[None, :]) & keep
        return dist, pos & (dist > thr), neg & (dist < alpha)

    @triton.jit
    def _online_max(ext, z, values, mask, T):
        """One tile of an online masked softmax of ``T values`` (FlashAttention's running
        maximum): ``(new_ext, z rescaled to it, e)``, ``e = exp(T (v - new_ext))`` on ``mask``
        (0 elsewhere) and ``z`` the running sum of ``e``. Every exponent is <= 0."""
        new = tl.maximum(ext, tl.max(tl.where(mask, values, float("-inf")), axis=1))
        # ext = new (also both -inf: nothing mined yet) keeps z; a larger maximum scales it.
        same = ext == new
        rescale = _scaled_exp(tl.where(same, 0.0, ext - tl.where(same, 0.0, new)), T)
        e = _masked_exp(mask, values - new[:, None], T)
        return new, z * rescale, e, rescale

    @triton.jit
    def _online_min(ext, z, values, mask, T):
        """:func:`_online_max` of ``exp(T (min - v))``: the ``Tn`` weights (eq. 9)."""
        new = tl.minimum(ext, tl.min(tl.where(mask, values, float("inf")), axis=1))
        same = ext == new
        rescale = _scaled_exp(tl.where(same, 0.0, new - tl.where(same, 0.0, ext)), T)
        e = _masked_exp(mask, new[:, None] - values, T)
        return new, z * rescale, e, rescale

    @triton.jit
    def _online_given(ext, z, g, mask):
        """:func:`_online_max` for a miner's weights ``g``: ``e = g / running max`` on
        ``mask`` (the reference scales each row's largest to 1)."""
        new = tl.maximum(ext, tl.max(tl.where(mask, g, 0.0), axis=1))
        rescale = tl.where(new > 0.0, ext / tl.where(new > 0.0, new, 1.0), 1.0)
        e = tl.where(mask & (new[:, None] > 0.0), g / tl.where(new > 0.0, new, 1.0)[:, None], 0.0)
        return new, z * rescale, e, rescale

    @triton.jit
    def stats_kernel(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                     wgt_ptr, out_ptr, n, m, d, sqn, sqd, srm, srd, scn, scm, swn, swm,
                     alpha, thr, Tn, Tp, split_cols,
                     BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                     DENSE: tl.constexpr, HAS_SELF: tl.constexpr, DIAGONAL: tl.constexpr,
                     GIVEN: tl.constexpr, POS_T0: tl.constexpr, NEG_T0: tl.constexpr,
                     TRACK_TN: tl.constexpr, PRECISION: tl.constexpr):
        """The row statistics of rows ``[pid_0 BLOCK_N, +BLOCK_N)`` over the columns of split
        ``pid_1``, written to ``out[pid_1]`` (``(splits, NUM_STATS, N)``)."""
        split = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < n
        zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
        ext_p, z_p, s_p, c_p = zero + float("-inf"), zero, zero, zero
        ext_n, z_n, s_n, c_n = zero + float("inf"), zero, zero, zero
        ext_t, z_t = zero + float("inf"), zero
        if GIVEN:
            ext_n = zero
        first = split * split_cols
        stop = tl.minimum(first + split_cols, m)
        for c0 in range(first, stop, BLOCK_M):
            cols = c0 + tl.arange(0, BLOCK_M)
            col_ok = cols < stop
            dist, pos, neg = _mined(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr,
                                    cat_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                                    scn, scm, alpha, thr, BLOCK_N, BLOCK_M, BLOCK_K, DENSE,
                                    HAS_SELF, DIAGONAL, PRECISION)
            if POS_T0:  # Tp = 0: the plain mean over the mined positives
                e = pos.to(tl.float32)
            else:
                ext_p, z_p, e, rescale = _online_max(ext_p, z_p, dist, pos, Tp)
                s_p = s_p * rescale
            z_p += tl.sum(e, axis=1)
            s_p += tl.sum(e * dist, axis=1)
            c_p += tl.sum(pos.to(tl.float32), axis=1)
            if GIVEN:
                g = tl.load(wgt_ptr + rows[:, None].to(tl.int64) * swn + cols[None, :] * swm,
                            mask=row_ok[:, None] & col_ok[None, :], other=0.0)
                ext_n, z_n, e, rescale = _online_given(ext_n, z_n, g, neg)
                s_n = s_n * rescale
                if TRACK_TN:  # "weight_share" still needs the Tn weight sum W-
                    ext_t, z_t, e_t, _ = _online_min(ext_t, z_t, dist, neg, Tn)
                    z_t += tl.sum(e_t, axis=1)
            elif NEG_T0:
                e = neg.to(tl.float32)
            else:
                ext_n, z_n, e, rescale = _online_min(ext_n, z_n, dist, neg, Tn)
                s_n = s_n * rescale
            z_n += tl.sum(e, axis=1)
            s_n += tl.sum(e * dist, axis=1)
            c_n += tl.sum(neg.to(tl.float32), axis=1)
        at = out_ptr + split * 10 * n + rows
        tl.store(at, ext_p, mask=row_ok)
        tl.store(at + n, z_p, mask=row_ok)
        tl.store(at + 2 * n, s_p, mask=row_ok)
        tl.store(at + 3 * n, c_p, mask=row_ok)
        tl.store(at + 4 * n, ext_n, mask=row_ok)
        tl.store(at + 5 * n, z_n, mask=row_ok)
        tl.store(at + 6 * n, s_n, mask=row_ok)
        tl.store(at + 7 * n, c_n, mask=row_ok)
        tl.store(at + 8 * n, ext_t, mask=row_ok)
        tl.store(at + 9 * n, z_t, mask=row_ok)

    @triton.jit
    def _coefficients(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                      wgt_ptr, coef_ptr, rows, cols, row_ok, col_ok, n, d, sqn, sqd, srm, srd,
                      scn, scm, swn, swm, alpha, thr, Tn, Tp,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                      DENSE: tl.constexpr, HAS_SELF: tl.constexpr, DIAGONAL: tl.constexpr,
                      GIVEN: tl.constexpr, POS_T0: tl.constexpr, NEG_T0: tl.constexpr,
                      PRECISION: tl.constexpr):
        """``C_ij = (cp_i w+_ij - cn_i w-_ij) / d_ij`` of one tile (0 at ``d = 0`` and off the
        mined pairs), recomputed: ``coef`` rows are ``cp = g lam_pos / Z+``, ``cn = g lam / Z-``
        and the two extremes of the forward, so ``w`` are the forward's weights."""
        dist, pos, neg = _mined(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr,
                                cat_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                                scn, scm, alpha, thr, BLOCK_N, BLOCK_M, BLOCK_K, DENSE,
                                HAS_SELF, DIAGONAL, PRECISION)
        cp = tl.load(coef_ptr + rows, mask=row_ok, other=0.0)
        cn = tl.load(coef_ptr + n + rows, mask=row_ok, other=0.0)
        if POS_T0:
            w_p = tl.where(pos, cp[:, None], 0.0)
        else:
            ext_p = tl.load(coef_ptr + 2 * n + rows, mask=row_ok, other=0.0)
            w_p = _masked_exp(pos, dist - ext_p[:, None], Tp) * cp[:, None]
        if GIVEN:
            ext_n = tl.load(coef_ptr + 3 * n + rows, mask=row_ok, other=1.0)
            g = tl.load(wgt_ptr + rows[:, None].to(tl.int64) * swn + cols[None, :] * swm,
                        mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            scale = cn / tl.where(ext_n > 0.0, ext_n, 1.0)
            w_n = tl.where(neg, g * scale[:, None], 0.0)
        elif NEG_T0:
            w_n = tl.where(neg, cn[:, None], 0.0)
        else:
            ext_n = tl.load(coef_ptr + 3 * n + rows, mask=row_ok, other=0.0)
            w_n = _masked_exp(neg, ext_n[:, None] - dist, Tn) * cn[:, None]
        # dd_ij / dq_i = (q_i - r_j) / d_ij; at d = 0 the cdist convention: no gradient.
        return tl.where(dist > 0.0, (w_p - w_n) / tl.where(dist > 0.0, dist, 1.0), 0.0)

    @triton.jit
    def grad_queries_kernel(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                            wgt_ptr, coef_ptr, out_ptr, n, m, d, sqn, sqd, srm, srd, scn, scm,
                            swn, swm, alpha, thr, Tn, Tp, split_cols,
                            BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_D: tl.constexpr, DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                            DIAGONAL: tl.constexpr, GIVEN: tl.constexpr, POS_T0: tl.constexpr,
                            NEG_T0: tl.constexpr, PRECISION: tl.constexpr):
        """``out[pid_2, rows, dims] = q * sum_j C - C R`` over split ``pid_2``'s columns."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        split = tl.program_id(2)
        row_ok = rows < n
        dim_ok = dims < d
        acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        first = split * split_cols
        stop = tl.minimum(first + split_cols, m)
        for c0 in range(first, stop, BLOCK_M):
            cols = c0 + tl.arange(0, BLOCK_M)
            col_ok = cols < stop
            c = _coefficients(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr,
                              cat_ptr, wgt_ptr, coef_ptr, rows, cols, row_ok, col_ok, n, d, sqn,
                              sqd, srm, srd, scn, scm, swn, swm, alpha, thr, Tn, Tp, BLOCK_N,
                              BLOCK_M, BLOCK_K, DENSE, HAS_SELF, DIAGONAL, GIVEN, POS_T0, NEG_T0,
                              PRECISION)
            total += tl.sum(c, axis=1)
            r = tl.load(r_ptr + cols[:, None] * srm + dims[None, :] * srd,
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = tl.dot(c, r, acc, input_precision=PRECISION)
        q = tl.load(q_ptr + rows[:, None] * sqn + dims[None, :] * sqd,
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        at = out_ptr + (split * n + rows[:, None]) * d + dims[None, :]
        tl.store(at, q * total[:, None] - acc, mask=row_ok[:, None] & dim_ok[None, :])

    @triton.jit
    def grad_refs_kernel(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr, cat_ptr,
                         wgt_ptr, coef_ptr, out_ptr, n, m, d, sqn, sqd, srm, srd, scn, scm,
                         swn, swm, alpha, thr, Tn, Tp, split_rows,
                         BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_D: tl.constexpr, DENSE: tl.constexpr, HAS_SELF: tl.constexpr,
                         DIAGONAL: tl.constexpr, GIVEN: tl.constexpr, POS_T0: tl.constexpr,
                         NEG_T0: tl.constexpr, PRECISION: tl.constexpr):
        """``out[pid_2, cols, dims] = r * sum_i C - C^T Q`` over split ``pid_2``'s rows."""
        cols = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        split = tl.program_id(2)
        col_ok = cols < m
        dim_ok = dims < d
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        total = tl.zeros((BLOCK_M,), dtype=tl.float32)
        first = split * split_rows
        stop = tl.minimum(first + split_rows, n)
        for r0 in range(first, stop, BLOCK_N):
            rows = r0 + tl.arange(0, BLOCK_N)
            row_ok = rows < stop
            c = _coefficients(q_ptr, r_ptr, qsq_ptr, rsq_ptr, lab_ptr, rlab_ptr, self_ptr,
                              cat_ptr, wgt_ptr, coef_ptr, rows, cols, row_ok, col_ok, n, d, sqn,
                              sqd, srm, srd, scn, scm, swn, swm, alpha, thr, Tn, Tp, BLOCK_N,
                              BLOCK_M, BLOCK_K, DENSE, HAS_SELF, DIAGONAL, GIVEN, POS_T0, NEG_T0,
                              PRECISION)
            total += tl.sum(c, axis=0)
            q = tl.load(q_ptr + rows[:, None] * sqn + dims[None, :] * sqd,
                        mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = tl.dot(tl.trans(c), q, acc, input_precision=PRECISION)
        r = tl.load(r_ptr + cols[:, None] * srm + dims[None, :] * srd,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        at = out_ptr + (split * m + cols[:, None]) * d + dims[None, :]
        tl.store(at, r * total[:, None] - acc, mask=col_ok[:, None] & dim_ok[None, :])
    # fmt: on
