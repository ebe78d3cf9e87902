"""The ``torch.library`` custom operators of the fused Ranked List kernel and their launch glue
(:mod:`.triton_kernel` documents the design and the public entry point; :mod:`.triton_jit`
holds the kernels).

* ``pml_rank::ranked_list`` (:func:`ranked_list_op`): ``(loss, pos_loss, neg_loss, num_pos,
  num_neg, stats)`` per query; autograd registered (:func:`_backward` calls the second op);
* ``pml_rank::ranked_list_grad`` (:func:`ranked_list_grad_op`): the gradient w.r.t. the queries
  or the references.

Both have fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces through them,
and both pass ``torch.library.opcheck``. Launch parameters travel as an ``int[]`` and a precision
string, :class:`~pml_rank_plugins.functional.triton_tiles.Tiles` as
:meth:`~pml_rank_plugins.functional.triton_tiles.Tiles.encode` writes them (the sizing helpers
and the score tile are shared with the histogram kernel there too). Without triton the module
imports and the operators are defined, but calling one on a non-empty batch fails
(:func:`.triton_kernel.triton_ranked_list_terms` checks first and says why). Pure torch + the
kernels, no PML import.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import triton_tiles
from . import triton_jit
from .gpu_steps import inverse_or_zero
from .triton_jit import NUM_STATS

_NAMESPACE = "pml_rank"


class _Launch:
    """The arguments every kernel shares (pointers, sizes, strides, parameters, flags)."""

    def __init__(self, queries, refs, labels, ref_labels, self_columns, categories, weights,
                 diagonal, alpha, margin, Tn, Tp, sizes, precision):  # fmt: skip
        dense, given = categories is not None, weights is not None
        dummy = queries  # unused pointers are never read (their branch is compiled out)
        q_sq, r_sq = (queries * queries).sum(1), (refs * refs).sum(1)
        cat = categories if dense else dummy
        wgt = weights if given else dummy
        self.pointers = (queries, refs, q_sq, r_sq, dummy if dense else labels,
                         dummy if dense else ref_labels,
                         self_columns if (self_columns is not None and not dense) else dummy,
                         cat, wgt)  # fmt: skip
        self.sizes = (len(queries), len(refs), queries.shape[1])
        self.strides = (*queries.stride(), *refs.stride(), *(cat.stride() if dense else (0, 0)),
                        *(wgt.stride() if given else (0, 0)))  # fmt: skip
        # A temperature above float32's range becomes inf: the kernels' exp(T 0) stays 1 and
        # every exp(T x), x < 0, is 0 (the hardest-pair limit, as reference.scaled_exp_).
        big = torch.finfo(torch.float32).max
        self.params = (alpha, alpha - margin, *(t if t <= big else float("inf") for t in (Tn, Tp)))
        # The operators' int[] and str back to the launch parameters.
        self.tiles = tiles = triton_tiles.Tiles.decode(sizes, precision)
        self.flags = dict(
            BLOCK_N=tiles.block_n, BLOCK_M=tiles.block_m,
            BLOCK_K=triton_tiles.width_block(tiles.block_k, self.sizes[2]),
            DENSE=dense, HAS_SELF=self_columns is not None and not dense,
            DIAGONAL=bool(diagonal) and not dense, GIVEN=given, POS_T0=Tp == 0.0,
            NEG_T0=Tn == 0.0, PRECISION=tiles.precision,
        )  # fmt: skip
        self.options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        self.target = triton_tiles.target_programs(queries.device, tiles)

    def run(self, kernel, grid, tensors, split, **flags):
        with triton_tiles.on_device(self.pointers[0].device):
            kernel[grid](*self.pointers, *tensors, *self.sizes, *self.strides, *self.params,
                         split, **self.flags, **flags, **self.options)  # fmt: skip


def merge_splits(parts: torch.Tensor, Tn: float, Tp: float, given: bool) -> torch.Tensor:
    """``(10, N)`` row statistics from the splits' ``(splits, 10, N)``: counts summed and, for
    each online softmax, the sums rescaled to the common extreme (``exp(T (ext_s - ext))``, or
    ``max_s / max`` for a miner's weights; a split with nothing mined adds 0). A fixed-order
    ``torch.sum``: deterministic. O(splits N)."""
    if len(parts) == 1:
        return parts[0]
    out = parts.sum(0)  # the counts, and the sums of a zero temperature, as they are

    def join(ext_row: int, sum_rows: tuple, ext: torch.Tensor, factor: torch.Tensor) -> None:
        # A split with nothing mined has an infinite extreme (factor NaN or inf): it adds 0.
        factor = torch.where(parts[:, sum_rows[0]] > 0, factor, 0.0)
        for row in sum_rows:
            out[row] = (parts[:, row] * factor).sum(0)
        out[ext_row] = ext

    if Tp != 0.0:
        ext = parts[:, 0].amax(0)
        join(0, (1, 2), ext, _scaled_exp(parts[:, 0] - ext, Tp))
    if given:
        ext = parts[:, 4].amax(0)
        join(4, (5, 6), ext, parts[:, 4] / torch.where(ext > 0, ext, 1.0))
        if Tn != 0.0:
            ext = parts[:, 8].amin(0)
            join(8, (9,), ext, _scaled_exp(ext - parts[:, 8], Tn))
    elif Tn != 0.0:
        ext = parts[:, 4].amin(0)
        join(4, (5, 6), ext, _scaled_exp(ext - parts[:, 4], Tn))
    return out


def _scaled_exp(x: torch.Tensor, T: float) -> torch.Tensor:
    """``exp(T x)`` with ``exp(T 0) = 1`` for any ``T`` (as :func:`.triton_jit._scaled_exp`)."""
    return torch.where(x == 0, 1.0, torch.exp(x * T))


def _row_statistics(launch: _Launch, track_tn: bool) -> torch.Tensor:
    n, m, _ = launch.sizes
    grid, split_cols = triton_tiles.forward_grid(n, m, launch.tiles, launch.target)
    parts = launch.pointers[0].new_empty(grid[1], NUM_STATS, n)
    launch.run(triton_jit.stats_kernel, grid, (parts,), split_cols, TRACK_TN=track_tn)
    _, _, Tn, Tp = launch.params
    return merge_splits(parts, Tn, Tp, launch.flags["GIVEN"])


def _losses(stats: torch.Tensor, alpha: float, margin: float, lam: float, lam_pos: float):
    """``(loss, pos_loss, neg_loss, inv_zp, inv_zn)`` from merged statistics (eqs. 11-13)."""
    inv_zp, inv_zn = inverse_or_zero(stats[1]), inverse_or_zero(stats[5])
    pos_loss = (stats[2] * inv_zp - (alpha - margin)).clamp_min_(0.0).mul_(stats[1] > 0)
    neg_loss = (alpha - stats[6] * inv_zn).mul_(stats[5] > 0).clamp_min_(0.0)
    return pos_loss * lam_pos + neg_loss * lam, pos_loss, neg_loss, inv_zp, inv_zn


def _gradient(launch: _Launch, coef: torch.Tensor, of_queries: bool):
    """``Q rowsum(C) - C R`` (``of_queries``) or ``R colsum(C) - C^T Q``, split and summed."""
    n, m, d = launch.sizes
    grid, per_split, block_d = triton_tiles.gradient_grid(
        n, m, d, launch.tiles, launch.target, of_queries
    )
    splits = grid[2]
    out = coef.new_empty(splits, n if of_queries else m, d)
    kernel = triton_jit.grad_queries_kernel if of_queries else triton_jit.grad_refs_kernel
    launch.run(kernel, grid, (coef, out), per_split, BLOCK_D=block_d)
    return out[0] if splits == 1 else out.sum(0)


# ---- The custom operators (torch.compile traces them through their fake implementations). ----


@torch.library.custom_op(f"{_NAMESPACE}::ranked_list", mutates_args=())
def ranked_list_op(
    queries: torch.Tensor,
    refs: torch.Tensor,
    labels: Optional[torch.Tensor],
    ref_labels: Optional[torch.Tensor],
    self_columns: Optional[torch.Tensor],
    categories: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    diagonal: bool,
    alpha: float,
    margin: float,
    Tn: float,
    Tp: float,
    lam: float,
    lam_pos: float,
    share: bool,
    tiles: list[int],
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, pos_loss, neg_loss, num_pos, num_neg, stats)`` per query (``stats``: the merged
    ``(10, N)`` row statistics). Inputs as :func:`triton_ranked_list_terms` passes them (checked
    there): float32 ``(N, d)`` / ``(M, d)``, int64 labels, int8 categories, float32 weights."""
    n = len(queries)
    if n == 0 or len(refs) == 0:
        stats = queries.new_zeros(NUM_STATS, n)
    else:
        launch = _Launch(queries, refs, labels, ref_labels, self_columns, categories, weights,
                         diagonal, alpha, margin, Tn, Tp, tiles, precision)  # fmt: skip
        stats = _row_statistics(launch, share and weights is not None and Tn != 0.0)
    loss, pos_loss, neg_loss, _, _ = _losses(stats, alpha, margin, lam, lam_pos)
    return loss, pos_loss, neg_loss, stats[3].long(), stats[7].long(), stats.clone()


@ranked_list_op.register_fake
def _ranked_list_fake(queries, refs, *args):
    n = queries.shape[0]
    rows = [queries.new_empty(n) for _ in range(3)]
    counts = [queries.new_empty(n, dtype=torch.int64) for _ in range(2)]
    return (*rows, *counts, queries.new_empty(NUM_STATS, n))


@torch.library.custom_op(f"{_NAMESPACE}::ranked_list_grad", mutates_args=())
def ranked_list_grad_op(
    queries: torch.Tensor,
    refs: torch.Tensor,
    labels: Optional[torch.Tensor],
    ref_labels: Optional[torch.Tensor],
    self_columns: Optional[torch.Tensor],
    categories: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    coef: torch.Tensor,
    diagonal: bool,
    alpha: float,
    margin: float,
    Tn: float,
    Tp: float,
    of_queries: bool,
    tiles: list[int],
    precision: str,
) -> torch.Tensor:
    """The gradient w.r.t. ``queries`` (``of_queries``) or ``refs`` of ``sum_i g_i L_i``, from
    ``coef`` ``(4, N)``: ``g lam_pos / Z+``, ``g lam / Z-`` and the forward's two extremes."""
    if min(len(queries), len(refs), queries.shape[1]) == 0:
        return torch.zeros_like(queries if of_queries else refs)
    launch = _Launch(queries, refs, labels, ref_labels, self_columns, categories, weights,
                     diagonal, alpha, margin, Tn, Tp, tiles, precision)  # fmt: skip
    return _gradient(launch, coef.contiguous(), of_queries)


@ranked_list_grad_op.register_fake
def _ranked_list_grad_fake(queries, refs, *args):
    of_queries = args[11]
    return torch.empty_like(queries if of_queries else refs)


def _setup_context(ctx, inputs, output) -> None:
    queries, refs, labels, ref_labels, self_columns, categories, weights = inputs[:7]
    ctx.save_for_backward(queries, refs, labels, ref_labels, self_columns, categories, weights,
                          output[5])  # fmt: skip
    diagonal, alpha, margin, Tn, Tp, lam, lam_pos, _, tiles, precision = inputs[7:]
    ctx.setup = (diagonal, alpha, margin, Tn, Tp, lam, lam_pos, tiles, precision)
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_loss, *_):
    *tensors, stats = ctx.saved_tensors
    diagonal, alpha, margin, Tn, Tp, lam, lam_pos, tiles, precision = ctx.setup
    # The per-query loss is linear in its mined distances (constant weights, eqs. 11-12).
    pos_scale = grad_loss * inverse_or_zero(stats[1]) * lam_pos
    neg_scale = grad_loss * inverse_or_zero(stats[5]) * lam
    coef = torch.stack([pos_scale, neg_scale, stats[0], stats[4]])
    grads = [
        ranked_list_grad_op(*tensors, coef, diagonal, alpha, margin, Tn, Tp, of_queries, tiles,
                            precision) if ctx.needs_input_grad[index] else None
        for index, of_queries in ((0, True), (1, False))
    ]  # fmt: skip
    return (*grads, *([None] * 15))


ranked_list_op.register_autograd(_backward, setup_context=_setup_context)


__all__ = ["merge_splits", "ranked_list_grad_op", "ranked_list_op"]
