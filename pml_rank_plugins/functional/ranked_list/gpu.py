"""Ranked List Loss for accelerators: dense chunks, no host synchronisation (the ``gpu`` backend).

The same loss and gradients as :func:`~pml_rank_plugins.functional.ranked_list.cpu.
chunked_ranked_list_terms` (Wang et al., CVPR 2019, eqs. 8-14: constant pair weights, so each
query's loss is linear in its mined distances), for the Euclidean distance
``d_ij = sqrt(max(0, |q_i|^2 + |r_j|^2 - 2 q_i.r_j))``, written for a device that runs a queue of
kernels: every step is a mask or a multiplication over a dense ``(rows, M)`` chunk
(:mod:`~pml_rank_plugins.functional.ranked_list.gpu_steps`), never ``nonzero``, boolean
indexing, ``.item()``, ``bool(tensor)``, ``unique``, ``bincount`` or ``int(...)`` of device
data, so the host queues forward and backward without waiting for the device. The ``cpu``
kernel instead keeps the few mined pairs as a sparse list (fast in CPU caches, but each chunk
syncs a GPU about a dozen times).

Chunks: ``rows_per_chunk(N, M, chunk_size, bytes_per_pair=bytes_per_pair(dtype), device=...)``
(:mod:`~pml_rank_plugins.functional.chunking`'s budget rule), decided once in forward and reused
in backward; ``chunk_size`` overrides. At one chunk (N = M = 4096 in float32 takes 320 MiB of the
2 GiB budget) the forward keeps the ``(N, M)`` coefficient matrix
``c_ij = (lam_pos w+_ij / Z+_i - lam w-_ij / Z-_i) / d_ij`` (0 at ``d = 0``) and the backward is
``grad_q = q * sum_j g_i c_ij - (g c) R`` (and ``grad_r = r * sum_i g_i c_ij - (g c)^T Q``): two
or three matrix products in all. With several chunks nothing ``N x M`` is kept: the backward
recomputes each chunk's distances, masks and weights (bit-identical to the forward).

Cost: time three ``N M d`` products (four with reference gradient; the forward's product is
repeated per chunk in the backward when there are several chunks) + about 30 elementwise
``(rows, M)`` passes; memory ``bytes_per_pair(dtype) x rows x M`` of chunk temporaries
(+ 4 or 8 bytes x N x M kept for the backward at one chunk) + ``O((N + M) d)``.

The ``triton`` backend no longer maps here for the loss: the fused kernel of
:mod:`.triton_kernel` recomputes tiles of ``Q R^T`` and keeps no ``N x M`` buffer. This path is
still the one for distances other than the default Euclidean ``LpDistance``, for float64 under
``auto``, and for :class:`~pml_rank_plugins.miners.RankedListMiner` on ``triton`` (its index
lists need the mined masks).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..chunking import rows_per_chunk
from ..query_weighting import log_weight_sums
from ..sync_free_inputs import autocast_off
from ..validation import check_finite, compute_dtype
from .gpu_steps import (
    DensePairs,
    DenseWeights,
    LabelPairs,
    inverse_or_zero,
    mine,
    query_scales,
    row_sums,
    weights,
)
from .params import (
    check_dist_masks,
    check_embedding_pair,
    check_loss_finite,
    check_loss_range,
    checked_params,
)
from .reference import RankedListTerms, _LinearInDistance

PairSource = Union[LabelPairs, DensePairs]


def bytes_per_pair(dtype: torch.dtype) -> int:
    """Bytes of chunk temporaries per (query, reference) pair: four float buffers (distances,
    the two weight matrices, one temporary) and four bool masks (candidates and mined pairs)."""
    return 4 * dtype.itemsize + 4


def chunk_rows_for(n: int, m: int, chunk_size: Optional[int], queries: torch.Tensor) -> int:
    """Rows per chunk under the ``gpu`` rule for ``queries``' dtype and device."""
    return rows_per_chunk(
        n, m, chunk_size, bytes_per_pair=bytes_per_pair(queries.dtype), device=queries.device
    )


def _chunk_terms(q, refs, ref_sq, pairs, given, params, start, stop, q_sq=None):
    """Distances, mined masks, weights and row sums of query rows ``[start, stop)``."""
    dist, pos, neg = mine(q, refs, ref_sq, pairs.candidates(start, stop), params, q_sq)
    w_pos, w_neg = weights(dist, pos, neg, params, given, start)
    return dist, pos, neg, w_pos, w_neg


def _times(values: torch.Tensor, factor: float) -> torch.Tensor:
    """``values * factor``; ``values`` itself for a factor of 1 (the same values, one operator
    fewer: ``lam`` and ``lam_pos`` default to 1)."""
    return values if factor == 1.0 else values * factor


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` view the same memory the same way (``b = a.detach()``): read from
    the tensors' metadata on the host, no device value. Under ``torch.compile`` only ``a is b``:
    dynamo cannot compare the data pointers of two different tensors (a graph break), and
    ``False`` only recomputes the query norms, the same values."""
    if torch.compiler.is_compiling():
        return a is b
    return a is b or (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _coefficients(dist, w_pos, w_neg, scale_pos, scale_neg) -> torch.Tensor:
    """``(w+ scale+ - w- scale-) / d``, 0 where ``d = 0`` or nothing is mined (``cdist``)."""
    coef = w_pos.mul_(scale_pos.unsqueeze(1)).sub_(w_neg.mul_(scale_neg.unsqueeze(1)))
    return coef.div_(dist).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


class _GpuRankedList(torch.autograd.Function):
    """``(loss, pos_loss, neg_loss, num_pos, num_neg, log_w)`` per query (``log_w`` empty unless
    ``params.share``); only ``loss`` is differentiable (w.r.t. ``queries`` and ``refs``).
    ``refs=None``: the references are ``queries`` itself (gradient through both ends of every
    pair, summed into ``queries``' gradient); ``None`` rather than the same tensor twice because
    ``torch.compile`` cannot trace an ``autograd.Function`` given one tensor as two inputs
    ("duplicate tensor input", a graph break)."""

    @staticmethod
    def forward(ctx, queries, refs, pairs, given, params, chunk_rows, check):
        is_self = refs is None
        refs = queries if is_self else refs
        n = len(queries)
        ref_sq = (refs * refs).sum(1)
        starts = range(0, max(n, 1), chunk_rows)  # one (empty) chunk when N = 0
        parts, log_ws = [], []
        single = len(starts) == 1
        for start in starts:
            stop = min(start + chunk_rows, n)
            q = queries if single else queries[start:stop]
            # The batch against itself in one chunk: the query norms are the reference norms.
            q_sq = ref_sq.unsqueeze(1) if single and _same_rows(queries, refs) else None
            dist, pos, neg, w_pos, w_neg = _chunk_terms(
                q, refs, ref_sq, pairs, given, params, start, stop, q_sq
            )
            if params.share:
                log_ws.append(
                    log_weight_sums(
                        dist, pos, neg, params.alpha, params.margin, params.Tn, params.Tp
                    )
                )
            parts.append(row_sums(dist, pos, neg, w_pos, w_neg))
        z_pos, s_pos, z_neg, s_neg, num_pos, num_neg = (
            parts[0] if single else [torch.cat(column) for column in zip(*parts)]
        )
        inv_zp, inv_zn = inverse_or_zero(z_pos), inverse_or_zero(z_neg)
        # Weighted mean distances, then the hinge offsets (eqs. 11, 12); >= 0 up to rounding.
        pos_loss = (s_pos * inv_zp - (params.alpha - params.margin)).clamp_min_(0.0)
        neg_loss = (params.alpha - s_neg * inv_zn).mul_(z_neg > 0).clamp_min_(0.0)
        pos_loss.mul_(z_pos > 0)
        loss = torch.add(_times(pos_loss, params.lam_pos), _times(neg_loss, params.lam))
        if check:
            check_loss_finite(loss, params.alpha, params.lam)
        if single:  # keep the coefficient matrix: the backward is two or three products
            coef = _coefficients(
                dist, w_pos, w_neg, _times(inv_zp, params.lam_pos), _times(inv_zn, params.lam)
            )
            ctx.save_for_backward(queries, None if is_self else refs, coef)
        else:
            ctx.save_for_backward(queries, None if is_self else refs, inv_zp, inv_zn)
        ctx.setup = (pairs, given, params, chunk_rows, single, is_self)
        log_w = torch.cat(log_ws) if params.share else queries.new_empty(0, dtype=torch.float64)
        ctx.mark_non_differentiable(pos_loss, neg_loss, num_pos, num_neg, log_w)
        # The five non-differentiable outputs get None, not zero tensors, in backward: five
        # operators (allocations) fewer per backward.
        ctx.set_materialize_grads(False)
        return loss, pos_loss, neg_loss, num_pos, num_neg, log_w

    @staticmethod
    def backward(ctx, grad_loss, *_):
        is_self = ctx.setup[-1]
        need_q, need_r = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if is_self:  # one tensor, both ends of every pair
            need_r = need_q
        if grad_loss is None or not (need_q or need_r):
            return None, None, None, None, None, None, None
        grad_q, grad_r = _GpuRankedList._gradients(ctx, grad_loss, need_q, need_r)
        if is_self:
            return grad_q.add_(grad_r), None, None, None, None, None, None
        return grad_q, grad_r, None, None, None, None, None

    @staticmethod
    def _gradients(ctx, grad_loss, need_q, need_r):
        """``(grad_queries, grad_refs)`` (``None`` where not needed)."""
        pairs, given, params, chunk_rows, single, is_self = ctx.setup
        # dd_ij/dq_i = (q_i - r_j) / d_ij, so with C_ij = g_i dL_i/dd_ij / d_ij:
        # grad_q = q * sum_j C - C R and grad_r = r * sum_i C - C^T Q.
        if single:
            queries, refs, coef = ctx.saved_tensors
            refs = queries if is_self else refs
            coef = coef * grad_loss.unsqueeze(1)
            grad_q = grad_r = None
            if need_q:
                grad_q = torch.addmm(queries * coef.sum(1, keepdim=True), coef, refs, alpha=-1.0)
            if need_r:
                grad_r = torch.addmm(refs * coef.sum(0).unsqueeze(1), coef.T, queries, alpha=-1.0)
            return grad_q, grad_r
        queries, refs, inv_zp, inv_zn = ctx.saved_tensors
        refs = queries if is_self else refs
        n = len(queries)
        scale_pos = grad_loss * inv_zp * params.lam_pos
        scale_neg = grad_loss * inv_zn * params.lam
        ref_sq = (refs * refs).sum(1)
        grad_q = torch.empty_like(queries) if need_q else None
        grad_r = torch.zeros_like(refs) if need_r else None
        col_sum = refs.new_zeros(len(refs)) if need_r else None
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            q = queries[start:stop]
            dist, _, _, w_pos, w_neg = _chunk_terms(
                q, refs, ref_sq, pairs, given, params, start, stop
            )
            coef = _coefficients(dist, w_pos, w_neg, scale_pos[start:stop], scale_neg[start:stop])
            if need_q:
                torch.addmm(
                    q * coef.sum(1, keepdim=True), coef, refs, alpha=-1.0, out=grad_q[start:stop]
                )
            if need_r:
                col_sum.add_(coef.sum(0))
                grad_r.addmm_(coef.T, q, alpha=-1.0)
        if need_r:
            grad_r.addcmul_(refs, col_sum.unsqueeze(1))
        return grad_q, grad_r


def gpu_ranked_list_terms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    pairs: PairSource,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    Tp: float = 0.0,
    lam: float = 1.0,
    neg_weights: Optional[DenseWeights] = None,
    chunk_size: Optional[int] = None,
    lam_pos: float = 1.0,
    query_weighting: str = "mean",
    check_values: bool = False,
) -> RankedListTerms:
    """Per-query Ranked List Loss of ``queries`` against ``refs`` (Euclidean), sync-free.

    Args:
        queries: ``(N, d)`` query embeddings (typically L2-normalized), float32/float64.
        refs: ``(M, d)`` references in the same dtype (``queries`` itself: gradient through
            both ends of every pair; ``queries.detach()``: through the query side only).
        pairs: the candidate pairs, a
            :class:`~pml_rank_plugins.functional.ranked_list.gpu_steps.LabelPairs` or
            :class:`~pml_rank_plugins.functional.ranked_list.gpu_steps.DensePairs`.
        alpha, margin, Tn, Tp, lam, lam_pos, query_weighting: as in
            :func:`~pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms`.
        neg_weights: optional
            :class:`~pml_rank_plugins.functional.ranked_list.gpu_steps.DenseWeights` replacing
            the ``Tn`` weights (renormalized over each query's mined negatives; constants).
        chunk_size: query rows per chunk (``None``: the ``gpu`` budget rule).
        check_values: also check that the loss is finite (reads a value back: one sync).

    Returns:
        :class:`~pml_rank_plugins.functional.ranked_list.reference.RankedListTerms` (``num_pos`` /
        ``num_neg`` int64 on the device); ``loss`` is differentiable w.r.t. ``queries`` and
        ``refs``.

    Shapes, dtypes and parameters are checked on the host (no value is read). Time O(N M d),
    memory O(chunk x M) (see the module docstring).
    """
    params = checked_params(alpha, margin, Tn, Tp, lam, lam_pos, query_weighting=query_weighting)
    check_embedding_pair(queries, refs)
    check_loss_range(queries.dtype, alpha, lam, lam_pos)
    n, m = len(queries), len(refs)
    chunk_rows = chunk_rows_for(n, m, chunk_size, queries)
    with autocast_off(queries.device.type):
        loss, pos_loss, neg_loss, num_pos, num_neg, log_w = _GpuRankedList.apply(
            queries,
            None if refs is queries else refs,
            pairs,
            neg_weights,
            params,
            chunk_rows,
            bool(check_values),
        )
        if params.share:
            # A constant per query: autograd scales the upstream gradient g_i by it.
            loss = loss * query_scales(log_w).to(loss.dtype)
            if check_values:
                check_loss_finite(loss.detach(), params.alpha, params.lam)
    return RankedListTerms(loss, pos_loss, neg_loss, num_pos, num_neg)


def gpu_ranked_list_terms_dense(
    dist: torch.Tensor,
    pos_mask: torch.Tensor,
    neg_mask: torch.Tensor,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    Tp: float = 0.0,
    lam: float = 1.0,
    neg_weights: Optional[DenseWeights] = None,
    lam_pos: float = 1.0,
    query_weighting: str = "mean",
    check_values: bool = False,
) -> RankedListTerms:
    """:func:`~pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms` on a precomputed
    ``(N, M)`` distance matrix (any PML distance object), with no host synchronisation: the
    ``gpu`` backend's path for distances other than the plain Euclidean one. Disjoint masks and
    finite distances are only checked with ``check_values``. O(N M) time and memory."""
    params = checked_params(alpha, margin, Tn, Tp, lam, lam_pos, query_weighting=query_weighting)
    check_dist_masks(dist, pos_mask, neg_mask)
    if check_values:
        check_finite(dist, "dist")
        if (pos_mask & neg_mask).any():
            raise ValueError("a (query, reference) pair is marked both positive and negative")
    dist = dist.to(compute_dtype(dist.dtype))
    check_loss_range(dist.dtype, alpha, lam, lam_pos)
    with torch.no_grad():
        d = dist.detach()
        pos = torch.gt(d, params.alpha - params.margin).logical_and_(pos_mask)
        neg = torch.lt(d, params.alpha).logical_and_(neg_mask)
        w_pos, w_neg = weights(d, pos, neg, params, neg_weights, 0)
        z_pos, s_pos, z_neg, s_neg, num_pos, num_neg = row_sums(d, pos, neg, w_pos, w_neg)
        inv_zp, inv_zn = inverse_or_zero(z_pos), inverse_or_zero(z_neg)
        pos_loss = (s_pos * inv_zp - (params.alpha - params.margin)).clamp_min_(0.0)
        neg_loss = (params.alpha - s_neg * inv_zn).mul_(z_neg > 0).clamp_min_(0.0)
        value = pos_loss.mul_(z_pos > 0) * params.lam_pos + neg_loss * params.lam
        coef = w_neg.mul_((inv_zn * -params.lam).unsqueeze(1))
        coef.addcmul_(w_pos, (inv_zp * params.lam_pos).unsqueeze(1))
        if params.share:
            scale = query_scales(
                log_weight_sums(d, pos, neg, params.alpha, params.margin, params.Tn, params.Tp)
            ).to(d.dtype)
            value = value * scale
            coef.mul_(scale.unsqueeze(1))
        if check_values:
            check_loss_finite(value, params.alpha, params.lam)
    loss = _LinearInDistance.apply(dist, coef, value) if dist.requires_grad else value
    return RankedListTerms(loss, pos_loss, neg_loss, num_pos, num_neg)


__all__ = [
    "DensePairs",
    "DenseWeights",
    "LabelPairs",
    "bytes_per_pair",
    "gpu_ranked_list_terms",
    "gpu_ranked_list_terms_dense",
]
