"""Chunked Ranked List Loss kernel: O(chunk x M) memory, no float N x M tensor in either pass.

Same loss as :func:`pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms`
(Wang et al., CVPR 2019, eqs. 8-14; the weights are constants, so each query's loss is linear in its mined
distances), computed straight from the embeddings for the Euclidean distance
``d_ij = ||q_i - r_j||`` (``sqrt(max(0, |q|^2 + |r|^2 - 2 q.r))``, as
:func:`~pml_rank_plugins.functional.euclidean.euclidean_distances`).

Per chunk of query rows (:func:`~pml_rank_plugins.functional.chunking.rows_per_chunk`), in
buffers allocated once and reused (steps 1-4:
:mod:`~pml_rank_plugins.functional.ranked_list.cpu_steps`):

1. ``D = dist(Q_chunk, R)`` (one ``(rows, d) x (d, M)`` product);
2. candidates from the pair categories (derived from the labels per chunk, or rows of a dense
   int8 tensor with a miner), then RLL's non-trivial mining ``d > alpha - m`` / ``d < alpha``;
3. weights: a masked softmax ``exp(Tp (d - max))`` over the mined positives and
   ``exp(Tn (min - d))`` over the mined negatives (or a miner's ``.weights``, scattered into the
   chunk from their sparse list), so no exponent is positive;
4. per-query sums: ``Z+ = sum w+``, ``S+ = sum w+ d`` (and ``Z-``, ``S-``), giving
   ``L_P = S+/Z+ - (alpha - m)``, ``L_N = alpha - S-/Z-``, ``L = lam_pos L_P + lam L_N``;
5. with ``query_weighting="weight_share"`` (the authors' Caffe layer, see
   :mod:`~pml_rank_plugins.functional.query_weighting`), also ``log W_i``, the log of query ``i``'s
   unnormalized pair-weight sum (one more float64 pass over the chunk); after all chunks each
   ``L_i`` is multiplied by the constant ``N c_i = N 0.5 W_i / sum_k W_k`` (outside the
   autograd function, so the backward below is unchanged and autograd scales ``g_i``).

Backward recomputes steps 1-3 per chunk (bit-identical to the forward) and forms
``c_ij = g_i (lam_pos w+_ij / Z+_i - lam w-_ij / Z-_i) / d_ij`` (0 at ``d = 0``, the ``cdist``
convention), then ``grad_q = q * sum_j c - c R`` and, when the references need gradient,
``grad_r = r * sum_i c - c^T Q``. Nothing of size N x M is kept between the passes: only
``O(N)`` per-query sums.

Cost, for N queries, M references, dimension d: time 3 products of ``N M d`` (4 when the
references get gradient), the minimum for a forward and a backward that does not store an
``N x M`` matrix, plus ``O(N M)`` elementwise work in cache-sized chunks; memory
``O(threads x chunk x M)`` floats of reused buffers (one set per thread) + ``O((N + M) d)``, and
with a miner's pairs ``N M`` bytes of categories plus the sparse weights.

On CPU the chunks run on ``torch.get_num_threads()`` Python threads with one torch thread each
(:mod:`~pml_rank_plugins.functional.chunk_threads`): the per-chunk operations are small, and run on
all intra-op threads each would end in a barrier that waits for any thread whose core another
process holds.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..chunk_threads import (
    ExclusiveRows,
    chunk_workers,
    glue_elements,
    map_chunks,
    one_torch_thread,
)
from ..chunking import DenseCategories, LabelCategories, rows_per_chunk
from ..query_weighting import log_weight_sums, query_scales
from .cpu_steps import (
    Workspace,
    dense_chunk_sums,
    dense_weights,
    mine_chunk,
    sparse_chunk,
)
from .params import check_embedding_pair, check_loss_finite, check_loss_range, checked_params
from .reference import RankedListTerms
from .sparse import SparseWeights, inverse_or_zero, segment_sum

# A chunk whose mined pairs are at most this fraction of its pairs keeps them as a sparse list
# (row, column: int32; coefficient) for the backward, 12-16 bytes per mined pair, i.e. at most
# half a byte per pair of the chunk; a denser chunk is recomputed in the backward instead.
SPARSE_FRACTION = 1 / 32


class _ChunkedRankedList(torch.autograd.Function):
    """``(loss, pos_loss, neg_loss, num_pos, num_neg, log_w)`` per query (``log_w`` empty unless
    ``params.share``); only ``loss`` is differentiable (w.r.t. ``queries`` and, when it requires
    grad, ``refs``).

    RLL mines few pairs (the non-trivial ones), so most chunks take the sparse path: after the
    distances and the mining masks, everything else (weights, sums, the backward coefficients
    ``c_ij = dL_i/dd_ij / d_ij``) runs on the list of mined pairs, which is kept for a backward of
    two sparse products. Chunks with more than ``SPARSE_FRACTION`` of their pairs mined run the
    dense path and are recomputed in the backward. Both give the same values.
    """

    @staticmethod
    def forward(ctx, queries, refs, categories, neg_source, params, chunk_rows):
        with one_torch_thread(queries.device, glue_elements(queries, refs)):
            return _ChunkedRankedList._forward(
                ctx, queries, refs, categories, neg_source, params, chunk_rows
            )

    @staticmethod
    def _forward(ctx, queries, refs, categories, neg_source, params, chunk_rows):
        n, m = len(queries), len(refs)
        ref_sq = (refs * refs).sum(1).unsqueeze(0)
        z_pos, s_pos = queries.new_zeros(n), queries.new_zeros(n)
        z_neg, s_neg = queries.new_zeros(n), queries.new_zeros(n)
        num_pos = torch.zeros(n, dtype=torch.long, device=queries.device)
        num_neg = torch.zeros_like(num_pos)
        log_w = queries.new_full((n if params.share else 0,), float("-inf"), dtype=torch.float64)
        starts = range(0, n, chunk_rows)
        workers = chunk_workers(len(starts), queries.device)
        source = ExclusiveRows(categories, workers)
        spaces = [Workspace(min(chunk_rows, n), m, queries) for _ in range(workers)]
        totals = (z_pos, s_pos, z_neg, s_neg, num_pos, num_neg)

        def chunk(index: int, worker: int):
            start = starts[index]
            stop = min(start + chunk_rows, n)
            rows, ws = stop - start, spaces[worker]
            cat = source.rows(start, stop, worker)
            dist, pos, neg = mine_chunk(queries[start:stop], refs, ref_sq, cat, params, ws)
            if params.share:
                log_w[start:stop] = log_weight_sums(
                    dist, pos, neg, params.alpha, params.margin, params.Tn, params.Tp
                )
            mined = torch.logical_or(pos, neg, out=ws.cand[:rows])
            stored = None
            if int(torch.count_nonzero(mined)) <= SPARSE_FRACTION * rows * m:
                sums, stored = sparse_chunk(dist, pos, mined, neg_source, params, ws, start)
            else:
                sums = dense_chunk_sums(dist, pos, neg, neg_source, params, ws, start)
            for total, part in zip(totals, sums):
                total[start:stop] = part
            return stored

        stored = map_chunks(chunk, len(starts), workers)
        sparse = [item for item in stored if item is not None]
        dense_starts = [start for start, item in zip(starts, stored) if item is None]
        inv_zp, inv_zn = inverse_or_zero(z_pos), inverse_or_zero(z_neg)
        # Weighted mean distances, then the hinge offsets (eqs. 11, 12); >= 0 up to rounding.
        pos_loss = (s_pos * inv_zp - (params.alpha - params.margin)).masked_fill_(z_pos <= 0, 0.0)
        neg_loss = (params.alpha - s_neg * inv_zn).masked_fill_(z_neg <= 0, 0.0)
        pos_loss.clamp_min_(0.0), neg_loss.clamp_min_(0.0)
        loss = params.lam_pos * pos_loss + params.lam * neg_loss
        check_loss_finite(loss, params.alpha, params.lam)
        ctx.save_for_backward(queries, refs, inv_zp, inv_zn)
        ctx.setup = (categories, neg_source, params, chunk_rows, sparse, dense_starts)
        ctx.mark_non_differentiable(pos_loss, neg_loss, num_pos, num_neg, log_w)
        return loss, pos_loss, neg_loss, num_pos, num_neg, log_w

    @staticmethod
    def backward(ctx, grad_loss, *_):
        queries, refs, _, _ = ctx.saved_tensors
        with one_torch_thread(queries.device, glue_elements(queries, refs)):
            return _ChunkedRankedList._backward(ctx, grad_loss)

    @staticmethod
    def _backward(ctx, grad_loss):
        queries, refs, inv_zp, inv_zn = ctx.saved_tensors
        categories, neg_source, params, chunk_rows, sparse, dense_starts = ctx.setup
        n, m = len(queries), len(refs)
        need_q, need_r = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_q = torch.zeros_like(queries) if need_q else None
        grad_r = torch.zeros_like(refs) if need_r else None
        if grad_loss is None or not (need_q or need_r):
            return grad_q, grad_r, None, None, None, None
        # dd_ij/dq_i = (q_i - r_j) / d_ij, so with c_ij = g_i dL_i/dd_ij / d_ij:
        # grad_q = q * sum_j c - c R and grad_r = r * sum_i c - c^T Q.
        # Sparse chunks: all their mined pairs form one sparse (N, M) coefficient matrix, so two
        # sparse products serve every chunk (a few large operations, no per-chunk loop).
        col_sum = refs.new_zeros(m) if need_r else None
        if sparse:
            row = torch.cat([r.long() + start for start, r, _, _ in sparse])
            col = torch.cat([c.long() for _, _, c, _ in sparse])
            val = torch.cat([v for _, _, _, v in sparse]) * grad_loss[row]
            coef = torch.sparse_coo_tensor(
                torch.stack([row, col]), val, (n, m), check_invariants=False
            )
            if need_q:
                grad_q.addcmul_(queries, segment_sum(val, row, n).unsqueeze(1))
                grad_q.sub_(torch.sparse.mm(coef, refs))
            if need_r:
                col_sum.index_add_(0, col, val)
                grad_r.sub_(torch.sparse.mm(coef.t(), queries))
        if dense_starts:
            scale_pos = grad_loss * inv_zp * params.lam_pos
            scale_neg = grad_loss * inv_zn * params.lam
            ref_sq = (refs * refs).sum(1).unsqueeze(0)
            # Without reference gradient each chunk writes only its rows: chunks run on threads.
            # With it they all add into grad_r, so they run in order (deterministic sums).
            workers = 1 if need_r else chunk_workers(len(dense_starts), queries.device)
            source = ExclusiveRows(categories, workers)
            spaces = [Workspace(min(chunk_rows, n), m, queries) for _ in range(workers)]

            def chunk(index: int, worker: int) -> None:
                start = dense_starts[index]
                stop = min(start + chunk_rows, n)
                q, ws = queries[start:stop], spaces[worker]
                cat = source.rows(start, stop, worker)
                dist, pos, neg = mine_chunk(q, refs, ref_sq, cat, params, ws)
                w_pos, w_neg = dense_weights(dist, pos, neg, neg_source, params, ws, start)
                coef = w_pos.mul_(scale_pos[start:stop, None])
                coef.sub_(w_neg.mul_(scale_neg[start:stop, None])).div_(dist)
                coef.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # d = 0: gradient 0, as cdist
                if need_q:
                    grad_q[start:stop].addcmul_(q, coef.sum(1, keepdim=True))
                    grad_q[start:stop].addmm_(coef, refs, alpha=-1.0)
                if need_r:
                    col_sum.add_(coef.sum(0))
                    grad_r.addmm_(coef.T, q, alpha=-1.0)

            map_chunks(chunk, len(dense_starts), workers)
        if need_r:
            grad_r.addcmul_(refs, col_sum.unsqueeze(1))
        return grad_q, grad_r, None, None, None, None


# A graph break under torch.compile: the chunk loop is a host program (threads, set_num_threads,
# a data-dependent sparse / dense path, Python state on ctx), not traced (see the chunk_threads
# module docstring).
@torch.compiler.disable
def chunked_ranked_list_terms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    Tp: float = 0.0,
    lam: float = 1.0,
    neg_weights: Optional[SparseWeights] = None,
    chunk_size: Optional[int] = None,
    lam_pos: float = 1.0,
    query_weighting: str = "mean",
) -> RankedListTerms:
    """Per-query Ranked List Loss of ``queries`` against ``refs`` with Euclidean distances.

    Args:
        queries: ``(N, d)`` (typically L2-normalized) query embeddings, finite, float32/float64.
        refs: ``(M, d)`` reference embeddings in the same dtype; pass ``queries`` itself to rank
            the batch against itself with gradient through both ends of every pair, or
            ``queries.detach()`` for gradient through the query side only.
        categories: per-pair categories, ``0`` candidate positive, ``1`` candidate negative,
            ``2`` ignored (self pair, unmined pair): a
            :class:`~pml_rank_plugins.functional.chunking.LabelCategories`,
            :class:`~pml_rank_plugins.functional.chunking.DenseCategories` or an ``(N, M)`` int8
            tensor.
        alpha, margin, Tn, Tp, lam, lam_pos: as in :func:`ranked_list_terms`.
        neg_weights: optional :class:`SparseWeights` replacing the ``Tn`` weights (renormalized
            over each query's mined negatives; constants).
        chunk_size: query rows per chunk (``None``: :func:`rows_per_chunk`).
        query_weighting: ``"mean"`` (default, eq. 14) or ``"weight_share"`` (the authors'
            Caffe layer: ``loss_i = N c_i L_i``, ``c_i = 0.5 W_i / sum_k W_k``), as in
            :func:`ranked_list_terms`; ``W_i`` uses ``Tn`` / ``Tp`` also with ``neg_weights``.

    Returns:
        :class:`~pml_rank_plugins.functional.ranked_list.reference.RankedListTerms`; ``loss`` is
        differentiable w.r.t. ``queries`` and ``refs``.

    Time O(N M d) (three ``N x M x d`` products, four with reference gradient) + O(N M)
    elementwise; memory O(threads x chunk x M) + O((N + M) d) beyond the inputs (see the module
    docstring).
    """
    params = checked_params(alpha, margin, Tn, Tp, lam, lam_pos, query_weighting=query_weighting)
    check_embedding_pair(queries, refs)
    if isinstance(categories, torch.Tensor):
        categories = DenseCategories(categories)
    if tuple(categories.shape) != (len(queries), len(refs)):
        raise ValueError(
            f"categories must have shape {(len(queries), len(refs))}, got {tuple(categories.shape)}"
        )
    check_loss_range(queries.dtype, alpha, lam, lam_pos)
    chunk_rows = rows_per_chunk(len(queries), len(refs), chunk_size)
    with torch.autocast(queries.device.type, enabled=False):
        loss, pos_loss, neg_loss, num_pos, num_neg, log_w = _ChunkedRankedList.apply(
            queries, refs, categories, neg_weights, params, chunk_rows
        )
        if params.share:
            # A constant per query: autograd scales the upstream gradient g_i by it.
            loss = loss * query_scales(log_w, params.Tn, params.Tp).to(loss.dtype)
            check_loss_finite(loss.detach(), params.alpha, params.lam)
    return RankedListTerms(loss, pos_loss, neg_loss, num_pos, num_neg)


# A graph break under torch.compile: the chunk loop is a host program (threads, set_num_threads,
# a data-dependent sparse / dense path, Python state on ctx), not traced (see the chunk_threads
# module docstring).
@torch.compiler.disable
def chunked_ranked_list_mining(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    chunk_size: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RLL's non-trivial pairs and normalized negative weights, chunk by chunk (no gradient).

    Returns ``(a1, p, a2, n, weights)``: mined positive pairs ``(a1, p)``, mined negative pairs
    ``(a2, n)`` sorted by anchor, and ``weights[k] = exp(Tn (alpha - d)) / sum`` over anchor
    ``a2[k]``'s mined negatives. Same chunking and memory as :func:`chunked_ranked_list_terms`
    plus the output (O(number of mined pairs)).
    """
    params = checked_params(alpha, margin, Tn)
    if isinstance(categories, torch.Tensor):
        categories = DenseCategories(categories)
    n, m = len(queries), len(refs)
    chunk_rows = rows_per_chunk(n, m, chunk_size)
    out = [[], [], [], [], []]
    device = queries.device
    glue = glue_elements(queries, refs)
    with (
        torch.no_grad(),
        torch.autocast(device.type, enabled=False),
        one_torch_thread(device, glue),
    ):
        ref_sq = (refs * refs).sum(1).unsqueeze(0)
        starts = range(0, n, chunk_rows)
        workers = chunk_workers(len(starts), queries.device)
        source = ExclusiveRows(categories, workers)
        spaces = [Workspace(min(chunk_rows, max(n, 1)), m, queries) for _ in range(workers)]

        def chunk(index: int, worker: int):
            start = starts[index]
            stop = min(start + chunk_rows, n)
            ws = spaces[worker]
            cat = source.rows(start, stop, worker)
            dist, pos, neg = mine_chunk(queries[start:stop], refs, ref_sq, cat, params, ws)
            _, w_neg = dense_weights(dist, pos, neg, None, params, ws, start)
            a1, p = pos.nonzero(as_tuple=True)
            a2, ng = neg.nonzero(as_tuple=True)
            weights = w_neg[a2, ng] * inverse_or_zero(w_neg.sum(1))[a2]
            return a1 + start, p, a2 + start, ng, weights

        for parts in map_chunks(chunk, len(starts), workers):
            for k, part in enumerate(parts):
                out[k].append(part)
    empty = torch.zeros(0, dtype=torch.long, device=queries.device)
    a1, p, a2, ng = (torch.cat(v) if v else empty for v in out[:4])
    weights = torch.cat(out[4]) if out[4] else queries.new_zeros(0)
    return a1, p, a2, ng, weights


__all__ = [
    "LabelCategories",
    "SparseWeights",
    "chunked_ranked_list_mining",
    "chunked_ranked_list_terms",
]
