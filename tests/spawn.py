"""Two spawned gloo processes for the distributed tests, and their teardown.

Rarely (about 1 in 24 runs of the two spawn tests of ``tests/trainers`` here, with the code of
before and after the one-thread glue alike), a rank is killed by SIGABRT ("terminate called
without an active exception", from C++) while the processes wind down. :func:`spawn_two` tells
that case apart from a failure of the code under test: each worker calls :func:`torn_down` as
its very last step, after ``destroy_process_group`` returned and every result was saved. When
SIGABRT comes after both ranks got that far, the results are complete and the test checks them
as usual, with a warning that names the abort; any other failure is raised as before.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import warnings
from pathlib import Path

import torch.multiprocessing as mp

# The ranks are forked from one forkserver per test process, which imports these modules once
# (4 s of CPU) instead of every rank importing them anew as under "spawn" (a pair of ranks: 9.4 s
# of CPU with "spawn", 5.7 s with the forkserver, and 2.6 s for each further pair). The server is
# a fresh process that only imported them (no threads, no process group) when it forks a rank.
PRELOAD = ["torch", "torch.distributed", "pytorch_metric_learning", "pml_rank_plugins.running"]


def _stop_forkserver() -> None:
    """Stop and reap the forkserver at exit, so that its CPU time and that of the ranks it forked
    count in the test process's children (``/usr/bin/time``, ``RUSAGE_CHILDREN``)."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


atexit.register(_stop_forkserver)


def _marker(prefix: str, rank: int) -> Path:
    return Path(f"{prefix}.torn_down.{rank}")


def torn_down(prefix: str, rank: int) -> None:
    """Called by a worker as its last step: everything before it completed."""
    _marker(prefix, rank).touch()


def spawn_two(worker, args: tuple, prefix: str) -> None:
    """``mp.spawn(worker, args=args, nprocs=2, join=True)`` with the forkserver start method
    (:data:`PRELOAD`); see the module docstring.

    Raises:
        torch.multiprocessing.ProcessExitedException: a rank failed, or was killed before both
            ranks called :func:`torn_down`.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # takes effect when the server starts: the first call
    try:
        mp.start_processes(worker, args=args, nprocs=2, join=True, start_method="forkserver")
    except mp.ProcessExitedException as error:
        if error.signal_name != "SIGABRT" or not all(
            _marker(prefix, rank).exists() for rank in range(2)
        ):
            raise
        warnings.warn(
            f"rank {error.error_index} was killed by SIGABRT after both ranks had torn down "
            "their process group and saved their results; checking the results",
            RuntimeWarning,
            stacklevel=2,
        )
