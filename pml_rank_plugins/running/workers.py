"""Where the worker processes of ``compare --jobs K`` and ``tune`` come from: a forkserver that
imported torch and this package once.

Under the ``spawn`` start method each worker is a fresh Python that imports torch and this
package anew: about 3 s of CPU per worker before it trains anything (a ``--jobs 2`` pool pays
it twice, ``tune`` once per method and worker). :func:`context` gives the ``forkserver`` context
instead: its server, a fresh Python started by the first pool of a process, imports
:data:`PRELOAD` once, and each worker is forked from it, so a pool of ``K`` pays the imports once
and every later pool of the same process not at all.

What a worker gets is what a ``spawn`` worker gets:

* no state of the pool's process: the server is a fresh interpreter that only imported modules
  (no threads, no process group, no CUDA: importing torch initializes no CUDA, so each worker
  initializes CUDA itself, never forking a process that used it); the jobs and the initializer's
  arguments reach the worker pickled, as under ``spawn``;
* the working directory and ``sys.path`` at the pool's start (multiprocessing's preparation
  data), and the environment and standard output/error at the pool's start too: the server has
  its own, from when it started, so :func:`parent_state` sends them along and
  :func:`adopt_parent` installs them first thing in the worker; NumPy's global random state is
  drawn afresh there (a forked worker would otherwise repeat the server's);
* it dies with the pool's process: :func:`.parent.exit_with_parent` watches that process by pid
  (the worker's operating-system parent is the server).

Trade-offs: modules of :data:`PRELOAD` that read the environment when imported read the server's,
from when it started; it starts with ``TQDM_DISABLE=1`` (every worker here runs without progress
bars), and torch's thread count is set in each worker from the pool's process. The server, an
idle process holding the imported modules (about 0.3 GiB of memory), lives as long as the process
that started it, and is stopped and reaped at exit (so its CPU time and its workers' count as that
process's children's). A forkserver started by other code (another preload, another environment)
is not used: :func:`context` then gives ``spawn``, as it does where there is no forkserver.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.forkserver
import os
import sys
import threading
from multiprocessing import reduction
from typing import Any

from .console import child_environment

# what every worker imports (the compare pool's chain of imports; ``tune`` workers also import
# Optuna, not preloaded, since a compare worker must not: tests/test_import_cost.py)
PRELOAD = ["torch", "torch.distributed", "numpy", "pml_rank_plugins.running.pool"]
_LOCK = threading.Lock()
_STARTED: dict[str, int] = {}  # {"owner": pid that started the server, "server": its pid}


def context() -> mp.context.BaseContext:
    """The start method of the workers: the ``forkserver`` context whose server this module
    started (with :data:`PRELOAD`; starting it on the first call), or ``spawn`` where there is
    no forkserver or one started by other code runs (see the module docstring)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001 -- the process's one server
    with _LOCK:
        running = server._forkserver_pid  # noqa: SLF001
        ours = _STARTED.get("owner") == os.getpid() and _STARTED.get("server") == running
        if running is not None and not ours:
            return mp.get_context("spawn")
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        with child_environment(TQDM_DISABLE="1"):
            server.ensure_running()  # restarts it, with this preload, if it died
        _STARTED.update(owner=os.getpid(), server=server._forkserver_pid)  # noqa: SLF001
    return ctx


def _stop_server() -> None:
    """At exit: stop and reap the server this process started (its workers are gone by then:
    the pools wait for them), so its CPU time counts in this process's children's."""
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001
    if _STARTED.get("owner") == os.getpid() and server._forkserver_pid == _STARTED["server"]:
        server._stop()  # noqa: SLF001 -- closes its "alive" pipe, then waits for it


atexit.register(_stop_server)


class _Stream:
    """A file descriptor of the pool's process, sent to the worker (a duplicate, passed along
    with the process like the pool's queues are) and read there with :meth:`fd`."""

    def __init__(self, fd: int):
        self._fd = fd

    def __reduce__(self):
        return (_Stream, (reduction.DupFd(self._fd),))

    def fd(self) -> int:
        fd = self._fd
        return fd.detach() if hasattr(fd, "detach") else fd


def parent_state(**environment: str) -> dict[str, Any]:
    """What :func:`adopt_parent` installs in a worker: this process's environment (updated with
    ``environment``) and standard output and error. Call it where the pool is built; pass it in
    the pool's ``initargs``."""
    streams = {}
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            continue  # closed here: the worker keeps the server's (nothing to send)
        streams[fd] = _Stream(fd)
    return {"environ": {**os.environ, **environment}, "streams": streams}


def adopt_parent(state: dict[str, Any]) -> None:
    """Worker side, first thing: the pool's process's environment and standard streams (see
    :func:`parent_state`), and NumPy's global random state drawn afresh, as in a spawned worker."""
    if dict(os.environ) != state["environ"]:
        os.environ.clear()
        os.environ.update(state["environ"])
    for target, stream in state["streams"].items():
        fd = stream.fd()
        if fd != target:
            for f in (sys.stdout, sys.stderr):
                if f is not None:
                    f.flush()
            os.dup2(fd, target)
            os.close(fd)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
