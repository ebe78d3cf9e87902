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

Faults: the process group has a timeout (:func:`setup`'s ``timeout``, else the environment
variable ``PML_RANK_DIST_TIMEOUT`` in seconds, else 300 s). A collective that waits longer (a rank
stopped, hung or far slower) fails on the ranks that waited; :func:`named_timeouts` turns that
failure into a :exc:`~pml_rank_plugins.running.RankTimeoutError` naming the rank(s) that did not
answer, found through the rendezvous store, and every rank exits. Before the process group exists
(the start of a ``compare`` or ``sweep`` under torchrun) :func:`is_main_process` reads ``RANK``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytorch_metric_learning
import torch
import torch.distributed as dist

from .. import __version__
from ..trainers.distributed import world_size

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENV = "PML_RANK_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
# How long a rank that timed out waits for the others to report in before naming the silent ones:
# the ranks that waited time out within about this long of each other.
MAX_REPORT_WAIT_S = 10.0
_STORE_KEY = "pml_rank/timed_out/{}"
# gloo: "Timed out waiting 2000ms for recv operation", then "Application timeout caused pair
# closure"; NCCL: "Watchdog caught collective operation timeout"
_TIMEOUT_MESSAGE = re.compile(r"timed out|timeout", re.IGNORECASE)
_timeout_s = DEFAULT_TIMEOUT_S  # of the process group set up by this process


class RankTimeoutError(TimeoutError):
    """A collective did not complete within the process-group timeout; the message names the
    rank(s) that did not answer (a ``TimeoutError``, so the CLI reports it in one line)."""


class TorchrunRefusedError(ValueError):
    """A command that does not run under torchrun was launched by it."""


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


def env_rank() -> int:
    """This process's rank from the torchrun environment (``RANK``); 0 outside torchrun."""
    return _env_int("RANK") if launched_by_torchrun() else 0


def refuse_under_torchrun(what: str) -> None:
    """Raise when several torchrun processes run ``what`` (a command that runs on one process).

    Args:
        what: the command, as the user typed it (e.g. ``"eval"``).

    Raises:
        TorchrunRefusedError: launched by torchrun with ``WORLD_SIZE`` > 1.
    """
    if launched_by_torchrun() and _env_int("WORLD_SIZE") > 1:
        raise TorchrunRefusedError(
            f"`pml-rank {what}` runs in one process and torchrun started "
            f"{os.environ['WORLD_SIZE']} (RANK={os.environ['RANK']}); run it without torchrun: "
            f"pml-rank {what} ..."
        )


def configured_timeout(timeout: float | None = None) -> float:
    """The process-group timeout in seconds: ``timeout``, else ``$PML_RANK_DIST_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT_S`.

    Args:
        timeout: seconds, or None for the environment variable / the default.

    Returns:
        A finite number of seconds > 0.

    Raises:
        ValueError: the value (naming where it came from) is not a finite number > 0.
    """
    source = "timeout"
    if timeout is None:
        raw = os.environ.get(TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_TIMEOUT_S
        source = f"environment variable {TIMEOUT_ENV}"
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
    if isinstance(timeout, bool) or not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(
            f"{source}={timeout!r}: the process-group timeout must be a number of seconds > 0, "
            f"e.g. {TIMEOUT_ENV}=300"
        )
    return float(timeout)


def setup(device: torch.device | str | None = None, timeout: float | None = None) -> DistContext:
    """The process group and device of this run.

    Args:
        device: the configured device (``--device`` or the config's ``device``). Under torchrun a
            CUDA device becomes ``cuda:LOCAL_RANK`` with the NCCL backend; a CPU device uses gloo.
        timeout: seconds a collective may wait for the other ranks before every rank gives up
            (see :func:`configured_timeout`; default ``$PML_RANK_DIST_TIMEOUT`` or 300).

    Returns:
        The run's :class:`DistContext`. An already initialized default process group (e.g. from
        tests or an outer launcher) is reused as it is. Outside torchrun with no process group:
        world size 1, ``device`` unchanged.

    Raises:
        RuntimeError: torchrun asks for CUDA that is not there, or more ranks than GPUs.
        ValueError: a bad timeout or torchrun variable.
    """
    global _timeout_s
    device = torch.device(device or "cpu")
    if dist.is_available() and dist.is_initialized():
        return _context(device, initialized_here=False)
    if not launched_by_torchrun() or _env_int("WORLD_SIZE") == 1:
        return DistContext(1, 0, 0, None, device)
    if not dist.is_available():
        raise RuntimeError("torchrun started this run but torch.distributed is not available")
    seconds = configured_timeout(timeout)
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
    # gloo raises on every waiting rank after the timeout; NCCL's watchdog aborts the process
    # after it (TORCH_NCCL_DESYNC_DEBUG=1 makes NCCL name the rank that did not join).
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=seconds))
    _timeout_s = seconds
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
    """True on rank 0 and in single-process runs.

    Before the process group exists (a torchrun ``compare`` before its first run sets it up)
    the rank comes from ``RANK``, so rank 1 never takes rank 0's part.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return env_rank() == 0


def is_peer_timeout(error: BaseException) -> bool:
    """True for a collective's failure after the process-group timeout (with a group of > 1)."""
    return (
        world_size() > 1
        and isinstance(error, RuntimeError)
        and bool(_TIMEOUT_MESSAGE.search(str(error)))
    )


@contextlib.contextmanager
def named_timeouts() -> Iterator[None]:
    """Turn a collective's timeout inside the block into a
    :exc:`~pml_rank_plugins.running.RankTimeoutError` that names the rank(s) that did not answer;
    other exceptions pass unchanged.

    Every rank that timed out records it in the rendezvous store and waits (at most the smaller
    of the timeout and ``MAX_REPORT_WAIT_S``) for the others to do the same: a rank that
    never reports is stopped, hung or dead, and is named.

    Raises:
        RankTimeoutError: from the collective's RuntimeError (chained).
    """
    try:
        yield
    except RankTimeoutError:
        raise
    except RuntimeError as e:
        if not is_peer_timeout(e):
            raise
        raise RankTimeoutError(_silent_ranks_message(e)) from e


def _silent_ranks_message(error: BaseException) -> str:
    rank, world = dist.get_rank(), dist.get_world_size()
    what = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    limit = f"the process-group timeout of {_timeout_s:g} s ({TIMEOUT_ENV})"
    wait = min(_timeout_s, MAX_REPORT_WAIT_S)
    others = [r for r in range(world) if r != rank]
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=wait))
        store.set(_STORE_KEY.format(rank), "1")
        deadline = time.monotonic() + wait
        silent = others
        while silent and time.monotonic() < deadline:
            silent = [r for r in silent if not store.check([_STORE_KEY.format(r)])]
            if silent:
                time.sleep(0.05)
    except RuntimeError as store_error:  # the store lives in rank 0 (or torchrun's agent)
        return (
            f"rank {rank}: no answer from the other ranks within {limit}, and the rendezvous "
            f"store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} did not "
            f"answer either ({store_error}): rank 0 or the launcher is stopped or hung; every "
            f"rank exits ({what})"
        )
    if silent:
        names = ", ".join(str(r) for r in silent)
        return (
            f"rank {rank}: rank {names} did not answer within {limit}; every rank exits. Look at "
            f"rank {names} (stopped, hung, or far slower), or raise {TIMEOUT_ENV} ({what})"
        )
    return (
        f"rank {rank}: a collective failed after {limit}, and every other rank timed out too: "
        f"this rank answered too late or the ranks waited in different collectives; every "
        f"rank exits ({what})"
    )


def barrier() -> None:
    """``dist.barrier()`` when a process group exists, else nothing.

    Raises:
        RankTimeoutError: a rank did not reach the barrier within the timeout (named).
    """
    if world_size() > 1:
        with named_timeouts():
            dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable objects; identity in one process).

    Raises:
        RankTimeoutError: a rank did not answer within the timeout (named).
    """
    if world_size() == 1:
        return obj
    box = [obj]
    with named_timeouts():
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
        with named_timeouts():
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
        # runs are bit-reproducible on one machine, not across CPU models: say which one
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
