"""Worker processes that die with their parent (``compare --jobs`` and ``tune`` workers).

A parent killed with ``kill -9`` never shuts its pool down, so its workers would train on,
orphaned, holding memory and run folders. :func:`exit_with_parent`, called first thing in a
worker: on Linux ``PR_SET_PDEATHSIG`` (the kernel sends SIGKILL when the thread that started the
worker ends; the pools here start their workers from the thread that waits for them), and
everywhere a daemon thread that exits the worker once its parent pid is no longer its parent
(within :data:`PARENT_POLL_S`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

LOGGER = logging.getLogger(__name__)
PARENT_POLL_S = 0.5  # a worker notices its parent's death within this long
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(parent_pid: int) -> None:
    """Worker side: die with the process ``parent_pid`` (see the module docstring)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            LOGGER.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    threading.Thread(
        target=_watch_parent, args=(parent_pid,), name="pml-rank-parent-watch", daemon=True
    ).start()


def _watch_parent(parent_pid: int) -> None:
    # the parent may already be gone before prctl took effect; getppid() then differs
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` runs on this machine (signal 0; EPERM counts as alive). A
    zombie (dead, not yet reaped: an orphan under an init that does not reap) is not alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]  # the field after "(comm)"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): signal 0 is all we know
    return state not in ("Z", "X")
