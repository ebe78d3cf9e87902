"""Multi-process runs under ``torchrun``: process group, device, rank-0 guards, run info.

``torchrun --nproc_per_node=R -m pml_rank_plugins.cli train CONFIG`` starts ``R`` processes with
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set.
:func:`setup` reads them, initializes the default process group (NCCL when the run's device is
CUDA, gloo otherwise) and picks the device (``cuda:LOCAL_RANK`` on GPUs). Without those variables
(a plain ``pml-rank train``) nothing is initialized and the run is single-process, as before.

Who does what (see :mod:`pml_rank_plugins.trainers.distributed` for the training step):

* every rank builds the same experiment from the same seed, so every rank's sampler yields the
  same global batch; the trainer embeds this rank's ``1/R`` slice;
* only rank 0 writes files (config, logs, tensorboard, checkpoints, ``metrics.json``) and runs
  evaluation; its results and RNG states are broadcast (:func:`broadcast_object`,
  :func:`sync_rng_state`) so every rank takes the same decisions and builds the same next batch.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import pytorch_metric_learning
import torch
import torch.distributed as dist

from .. import __version__
from ..trainers.distributed import world_size

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """How this process runs: ``world_size`` 1 means a plain single-process run."""

    world_size: int
    rank: int
    local_rank: int
    backend: str | None
    device: torch.device
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """True when the torchrun environment variables are all set."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def _env_int(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def setup(device: torch.device | str | None = None) -> DistContext:
    """The process group and device of this run.

    ``device`` is the configured device (``--device`` or the config's ``device``). Under torchrun
    a CUDA device becomes ``cuda:LOCAL_RANK`` with the NCCL backend; a CPU device uses gloo. An
    already initialized default process group (e.g. from tests or an outer launcher) is reused.
    Outside torchrun with no process group: world size 1, ``device`` unchanged.
    """
    device = torch.device(device or "cpu")
    if dist.is_available() and dist.is_initialized():
        return _context(device, initialized_here=False)
    if not launched_by_torchrun() or _env_int("WORLD_SIZE") == 1:
        return DistContext(1, 0, 0, None, device)
    if not dist.is_available():
        raise RuntimeError("torchrun started this run but torch.distributed is not available")
    local_rank = _env_int("LOCAL_RANK")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device {device} requested under torchrun but CUDA is not available; "
                "use --device cpu (gloo) or run on GPU machines"
            )
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                "use --nproc_per_node <= the number of GPUs"
            )
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return _context(device, initialized_here=True)


def _context(device: torch.device, initialized_here: bool) -> DistContext:
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
    return DistContext(
        world, rank, local_rank, dist.get_backend(), device, initialized_here=initialized_here
    )


def teardown(ctx: DistContext) -> None:
    """Destroy the process group if :func:`setup` created it."""
    if ctx.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def shutdown() -> None:
    """Destroy the default process group if one exists (end of a torchrun CLI process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """True on rank 0 (and in single-process runs)."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """``dist.barrier()`` when a process group exists, else nothing."""
    if world_size() > 1:
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable objects; identity in one process)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def sync_rng_state(get_state, set_state) -> None:
    """Give every rank rank 0's RNG states (``get_state()`` -> picklable, ``set_state(s)``).

    Rank 0 alone evaluates, and PyTorch's ``DataLoader`` draws its base seed from the global RNG,
    so after evaluation rank 0's RNG is ahead; the next global batch must still be the same on
    every rank (and the same as in a single-process run, which also evaluates).
    """
    if world_size() > 1:
        set_state(broadcast_object(get_state() if is_main_process() else None))


def run_info(ctx: DistContext, amp: dict | None = None) -> dict:
    """How this run ran, for ``metrics.json``: world size, backend, every rank's device, versions.

    Collective under torch.distributed (every rank must call it).
    """
    device = str(ctx.device)
    if ctx.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(ctx.device)})"
    devices = [device]
    if ctx.distributed:
        devices = [None] * ctx.world_size
        dist.all_gather_object(devices, device)
    return {
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "devices": devices,
        "amp": amp,
        "torch": torch.__version__,
        "pytorch_metric_learning": pytorch_metric_learning.__version__,
        "pml_rank_plugins": __version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
