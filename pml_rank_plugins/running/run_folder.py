"""A run folder's safety rules: one live run at a time, nothing wiped by accident.

* :func:`lock` takes an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for the whole run; a second
  run into the same folder is refused with :class:`RunFolderBusy` naming the folder and the
  holder's pid. The lock dies with its process (also on SIGKILL), so there is no stale lock to
  clean up; the ``.lock`` file itself stays (deleting it would race with a waiting run).
* :func:`prepare` refuses to start a fresh run in a folder that already holds one (finished or
  partial) unless ``overwrite`` is set, and then removes only the run's own outputs
  (:data:`RUN_OUTPUTS`). A refused run touches nothing.
* Reading checkpoints safely is :mod:`.checkpoints`' job (:func:`.checkpoints.load_checkpoint`).
* :func:`remove_partial_writes` deletes the ``checkpoints/.latest.pt.*.tmp`` and
  ``checkpoints/.best.pt.*.tmp`` files a killed ``atomic_torch_save`` leaves behind, nothing else
  (call it while holding the lock, once the run is accepted).
* :func:`disk_full_as_error` turns a full disk while writing into one line,
  ``No space left on device: PATH`` (:class:`DiskFullError`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

LOGGER = logging.getLogger(__name__)
LOCK_NAME = ".lock"
# What a run writes into its folder (what ``--overwrite`` removes; nothing else is touched).
RUN_OUTPUTS = ("config.yaml", "checkpoints", "logs", "tensorboard", "metrics.json", "eval.json")


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (the message says why and what to do)."""


class RunFolderBusy(RunFolderError):
    """Another live process holds the run folder's lock."""


class DiskFullError(RunFolderError):
    """The disk filled up while a run wrote ``PATH`` (message ``No space left on device: PATH``)."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` or an exception it chains is ``OSError`` ENOSPC (torch.save wraps it in
    a ``RuntimeError: ... unexpected pos`` whose own text does not say so)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def disk_full_as_error(path: str | Path) -> Iterator[None]:
    """Raise :class:`DiskFullError` ``No space left on device: PATH`` for a full disk in the block.

    Args:
        path: the file being written (named in the message).
    """
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if is_disk_full(e):
            raise DiskFullError(f"No space left on device: {path}") from e
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (e.g. ``metrics.json``); a full disk is :class:`DiskFullError`."""
    with disk_full_as_error(path):
        Path(path).write_text(text)


@contextlib.contextmanager
def lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on ``run_dir`` (created if missing) for the ``with`` block.

    Raises :class:`RunFolderBusy` at once (no waiting) when another open lock exists, including
    one taken by the same process through another ``lock`` call.
    """
    import fcntl  # POSIX only; imported here so the rest of the package imports anywhere

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunFolderBusy(
                f"{run_dir} is in use by another run (pid {holder}); wait for it to finish or "
                "give another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield run_dir
    finally:
        os.close(fd)  # releases the flock


def describe_run(run_dir: Path) -> str | None:
    """``None`` for a folder without run outputs, else a short description of the run in it."""
    present = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not present:
        return None
    if (run_dir / "metrics.json").exists():
        try:
            status = json.loads((run_dir / "metrics.json").read_text()).get("status", "finished")
        except (ValueError, AttributeError):
            status = "finished"
        return f"a {'failed' if status == 'failed' else 'finished'} run (metrics.json)"
    if (run_dir / "checkpoints" / "latest.pt").exists():
        return "a partial run (checkpoints/latest.pt)"
    return f"the outputs of an earlier run ({', '.join(present)})"


def prepare(run_dir: str | Path, resume: bool, overwrite: bool) -> None:
    """Make ``run_dir`` ready for a run (call while holding :func:`lock`).

    Resuming keeps everything. A fresh run into a folder with run outputs raises
    :class:`RunFolderError` (having touched nothing) unless ``overwrite``, which removes exactly
    :data:`RUN_OUTPUTS`. Leftovers of killed writes are not removed here: call
    :func:`remove_partial_writes` once the run is accepted.

    Args:
        run_dir: the run folder.
        resume: the run continues the one in the folder.
        overwrite: replace an earlier run's outputs.

    Raises:
        RunFolderError: the folder holds a run and neither ``resume`` nor ``overwrite`` is set.
    """
    run_dir = Path(run_dir)
    if resume:
        return
    found = describe_run(run_dir)
    if found is None:
        return
    if not overwrite:
        raise RunFolderError(
            f"{run_dir} already holds {found}; pass --resume to continue it, --overwrite to "
            "replace it, or give another --out"
        )
    LOGGER.warning("--overwrite: removing %s from %s", found, run_dir)
    for name in RUN_OUTPUTS:
        target = run_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


# The checkpoint files ``atomic_torch_save`` writes; its temporary files are ``.NAME.*.tmp``.
CHECKPOINT_FILES = ("latest.pt", "best.pt")


def remove_partial_writes(run_dir: str | Path) -> list[Path]:
    """Delete the ``checkpoints/.NAME.*.tmp`` leftovers of killed checkpoint writes.

    Only the temporary files of :data:`CHECKPOINT_FILES` in ``RUN_DIR/checkpoints`` are removed;
    other hidden files of the user stay. Call it while holding :func:`lock`.

    Args:
        run_dir: the run folder.

    Returns:
        The removed files.
    """
    folder = Path(run_dir) / "checkpoints"
    leftovers = [
        p for name in CHECKPOINT_FILES for p in folder.glob(f".{name}.*.tmp") if p.is_file()
    ]
    for p in leftovers:
        LOGGER.warning("removing %s, left by an interrupted checkpoint write", p)
        p.unlink(missing_ok=True)
    return leftovers
