"""``torch.distributed`` primitives shared by the trainers and the loss wrappers.

One process group, ``R`` ranks, rank ``r`` holding ``n_r`` rows; the global batch is the
concatenation of the ranks' rows **in rank order** (the same order on every rank). Without an
initialized process group every function is the one-process identity (``R = 1``).

Two ways to gather rows with a gradient, for the two places a rank's rows enter the loss:

* :func:`all_gather_with_grad` -- the rank's own rows stay attached, the other ranks' rows are
  constants, and the gradient reaching the own rows is multiplied by ``R``: every rank computes
  the **whole** loss, so ``dL/dE_r`` is complete on rank ``r``, and DDP's averaging of parameter
  gradients over ranks (``1/R``) turns ``R dL/dE_r`` into the one-process gradient;
* :func:`all_gather_to_owners` -- every row is attached, and the backward pass sums the
  gradients of a row over all ranks and returns the sum to the row's owner (an ``all_reduce`` of
  the ``(sum_r n_r, ...)`` gradient): for a loss split over ranks, ``L = sum_r L_r``, where rank
  ``r``'s part ``L_r`` (its own queries) also depends on the other ranks' rows as references.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_rows",
    "all_gather_to_owners",
    "all_gather_with_grad",
    "is_initialized",
    "rank",
    "scale_grad",
    "world_size",
]


def is_initialized() -> bool:
    """True when ``torch.distributed`` is available and a process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """``torch.distributed``'s world size, 1 when no process group is initialized."""
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    """This process's rank in the default process group, 0 when none is initialized."""
    return dist.get_rank() if is_initialized() else 0


def all_gather_rows(local: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """Concatenate every rank's rows (shards may differ in length); returns the global tensor
    (not differentiable) and the slice of the local rows in it.

    ``local``: ``(n_r, ...)``; returns ``(sum_r n_r, ...)``. Cost: two all-gathers (the sizes,
    then the rows padded to the largest shard).
    """
    world = world_size()
    if world == 1:
        return local, slice(0, len(local))
    sizes = [torch.zeros(1, dtype=torch.long, device=local.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(local)], device=local.device))
    sizes = [int(s) for s in sizes]
    padded = local.new_zeros((max(sizes), *local.shape[1:]))
    padded[: len(local)] = local
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    start = sum(sizes[: rank()])
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)]), slice(start, start + len(local))


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` unchanged, its gradient multiplied by ``factor`` on the way back."""
    return _ScaleGrad.apply(x, float(factor))


def all_gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Every rank's rows, in rank order, with this rank's rows differentiable.

    ``local``: (n_r, ...) on rank r; returns (sum_r n_r, ...). The gradient reaching ``local`` is
    multiplied by the world size ``R`` (see the module docstring: DDP's averaging then yields the
    single-process gradient). One process: ``local`` itself. Cost: one all-gather of the rows.
    """
    world = world_size()
    if world == 1:
        return local
    gathered, rows = all_gather_rows(local.detach())
    scaled = scale_grad(local, world)
    return torch.cat([gathered[: rows.start], scaled, gathered[rows.stop :]])


class _GatherToOwners(torch.autograd.Function):
    """Forward: the gathered rows; backward: all-reduce (sum) the global gradient, keep the own
    rows."""

    @staticmethod
    def forward(ctx, local, holder: list):
        gathered, rows = all_gather_rows(local)
        ctx.rows = rows
        holder.append(rows)
        return gathered

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rows], None


def all_gather_to_owners(local: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """Every rank's rows, in rank order, all differentiable, and the slice of the own rows.

    ``local``: (n_r, ...); returns ((sum_r n_r, ...), slice). The backward pass sums each row's
    gradient over the ranks and hands it to the row's owner (module docstring), so every rank
    must run backward through it (as under DDP). The gradient is not scaled. One process:
    ``local`` itself. Cost: the forward's all-gathers and one all-reduce of the
    ``(sum_r n_r, ...)`` gradient.
    """
    if world_size() == 1:
        return local, slice(0, len(local))
    holder: list = []
    gathered = _GatherToOwners.apply(local, holder)
    return gathered, holder[0]
