"""What every loss of this package does last in ``forward``: the output dtype, and a warning
when PML's ``DistributedLossWrapper(efficient=True)`` calls it (wrong gradients)."""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist

from ..functional.backend import resolve_backend

# How far up the stack PML's wrapper can be: its forward_regular_loss -> Module.__call__ ->
# _call_impl -> the loss's forward (-> SelfIndexForward.forward) -> here.
_MAX_FRAMES = 8
_PML_DISTRIBUTED = "pytorch_metric_learning.utils.distributed"

PML_EFFICIENT_WARNING = (
    "{name} is called by PML's DistributedLossWrapper(efficient=True), which gives wrong "
    "gradients with this loss (the other ranks' rows carry no gradient and the loss is "
    "multiplied by the world size, see docs/distributed.md): use "
    "pml_rank_plugins.utils.DistributedLossWrapper (exact in both modes) or PML's with "
    "efficient=False"
)


_CONCRETE_BACKENDS = frozenset({"cpu", "gpu", "triton"})


def call_backend(
    device: torch.device, backend: str | None, dtype: torch.dtype | None = None
) -> str:
    """The backend a loss call runs on: ``resolve_backend(device, backend, dtype=dtype)``
    (``dtype``: the embeddings', which decides ``auto`` on CUDA), except that a
    concrete ``backend`` keyword (checked when the loss was built) is returned as is. Same
    result; it skips ``check_backend``, which looks the triton package up on disk on every call
    (``importlib.util.find_spec``, ~90 us of host time) for ``backend="triton"``."""
    if backend in _CONCRETE_BACKENDS:
        return backend
    return resolve_backend(device, backend, dtype=dtype)


def loss_dtype(embeddings: torch.Tensor) -> torch.dtype | None:
    """The dtype a loss of this package returns for ``embeddings``, or ``None`` (leave it).

    Under ``torch.autocast`` for the embeddings' device: float32 (float64 embeddings: float64),
    as PML's losses return it; the loss is computed in float32 either way, and the gradient
    reaching the embeddings keeps their dtype. Outside autocast: the embeddings' dtype (a
    float16 loss for float16 embeddings, computed in float32 then rounded).
    """
    if not isinstance(embeddings, torch.Tensor) or not embeddings.is_floating_point():
        return None
    if torch.is_autocast_enabled(embeddings.device.type):
        return torch.promote_types(torch.float32, embeddings.dtype)
    return embeddings.dtype


def finish_loss(loss: torch.Tensor, embeddings: torch.Tensor, owner: object) -> torch.Tensor:
    """``loss`` cast to :func:`loss_dtype` (differentiable), after :func:`warn_pml_efficient`."""
    warn_pml_efficient(owner)
    dtype = loss_dtype(embeddings)
    if dtype is not None and isinstance(loss, torch.Tensor) and loss.dtype != dtype:
        loss = loss.to(dtype)
    return loss


def warn_pml_efficient(owner: object) -> None:
    """``UserWarning`` when PML's ``DistributedLossWrapper`` with ``efficient=True`` is the
    caller of ``owner`` (found on the call stack, only when a process group is initialized: no
    cost and no false alarm otherwise; its ``efficient=False`` is exact and passes)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        frame = frame.f_back
        if frame is None:
            return
        if (
            frame.f_globals.get("__name__") == _PML_DISTRIBUTED
            and frame.f_code.co_name == "forward_regular_loss"
        ):
            if getattr(frame.f_locals.get("self"), "efficient", False):
                warnings.warn(
                    PML_EFFICIENT_WARNING.format(name=type(owner).__name__),
                    UserWarning,
                    stacklevel=2,
                )
            return
