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
* Nothing outside ``--out`` is written through a link: :func:`lock` refuses a run folder or
  ``.lock`` that is a symbolic link (:func:`open_lock_file`, ``O_NOFOLLOW``), :func:`prepare`
  refuses run outputs that are links, and :func:`inside` checks that a path resolves inside
  ``--out`` (:func:`.pool.make_jobs` uses it for every run folder).
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
import stat
import threading
from pathlib import Path
from typing import Iterator

from ..experiment.errors import RunFolderError

LOGGER = logging.getLogger(__name__)
LOCK_NAME = ".lock"
# What a run writes into its folder (what ``--overwrite`` removes; nothing else is touched).
RUN_OUTPUTS = (
    "config.yaml",
    "checkpoints",
    "logs",
    "tensorboard",
    "metrics.json",
    "eval.json",
    "embeddings",  # the final test's, for the pictures (training.save_test_embeddings)
)


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


class UnsafeRunFolder(RunFolderError):
    """A run folder or lock file that is a symbolic link (or a lock file that is no plain file
    of its own): writing through it would change a file elsewhere."""


def inside(out_dir: str | Path, path: str | Path) -> bool:
    """Whether ``path`` resolves to ``out_dir`` or to something below it (both resolved).

    Symbolic links are followed (``OUT/m -> /home/me`` makes ``OUT/m/seed0`` outside), and ``..``
    components count, so a run folder built from a name cannot leave ``--out``. Paths that do not
    exist yet resolve through their existing part.

    Args:
        out_dir: the command's ``--out``.
        path: a path the command is about to create, write or delete.
    """
    return Path(path).resolve().is_relative_to(Path(out_dir).resolve())


def open_lock_file(path: str | Path) -> int:
    """Open (creating it, mode 0644) the lock file ``path`` for reading and writing; returns the fd.

    The file is opened with ``O_NOFOLLOW``: a symbolic link at ``path`` (dangling or not) is
    refused instead of creating or truncating its target, and so is anything but a plain file
    with a single name (a hard link to another file would be truncated just the same).

    Raises:
        UnsafeRunFolder: ``path`` is a symbolic link, a hard link or not a plain file; the
            message names it.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise UnsafeRunFolder(
                f"{path} is a symbolic link{_target(path)}; a lock file must be a plain file: "
                "remove the link"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a plain file" if not stat.S_ISREG(st.st_mode) else "a hard link"
        raise UnsafeRunFolder(f"{path} is {what}; a lock file must be a plain file: remove it")
    return fd


def _target(path: str | Path) -> str:
    try:
        return f" (to {os.readlink(path)})"
    except OSError:  # not a link itself (a link further up the path)
        return ""


# Folders whose lock this thread holds with ``lock(..., nested=True)`` (resolved paths).
_NESTED = threading.local()


def _flock_or_busy(fd: int, run_dir: Path) -> None:
    """Take ``fd``'s exclusive flock at once, or raise :class:`RunFolderBusy` naming the holder."""
    import fcntl  # POSIX only; imported here so the rest of the package imports anywhere

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        raise RunFolderBusy(
            f"{run_dir} is in use by another run (pid {holder}); wait for it to finish or "
            "give another --out"
        ) from None


@contextlib.contextmanager
def lock(run_dir: str | Path, nested: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on ``run_dir`` (created if missing) for the ``with`` block.

    Raises :class:`RunFolderBusy` at once (no waiting) when another open lock exists, including
    one taken by the same process through another ``lock`` call -- except inside a
    ``lock(run_dir, nested=True)`` block of the same thread, where a further ``lock(run_dir)``
    reuses the held lock (:func:`~pml_rank_plugins.running.run_job` holds the folder across
    ``runner.train``, so its stale-record cleanup and failure record happen under the lock too). A
    ``run_dir`` that is a symbolic link, or whose ``.lock`` is one, is refused
    (:class:`UnsafeRunFolder`): a run folder received from someone else must not make the run write
    elsewhere. A refused lock writes nothing.

    Args:
        run_dir: the run folder.
        nested: let later ``lock`` calls of this thread for the same folder share the lock.
    """
    run_dir = Path(run_dir)
    if run_dir.is_symlink():
        raise UnsafeRunFolder(
            f"{run_dir} is a symbolic link{_target(run_dir)}; give the folder it points to as "
            "--out, or remove the link"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    key = str(run_dir.resolve())
    held: set[str] = _NESTED.__dict__.setdefault("held", set())
    if key in held:  # inside this thread's lock(run_dir, nested=True): share it
        yield run_dir
        return
    path = run_dir / LOCK_NAME
    fd = open_lock_file(path)
    try:
        _flock_or_busy(fd, run_dir)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if nested:
            held.add(key)
        try:
            yield run_dir
        finally:
            held.discard(key)
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
    :data:`RUN_OUTPUTS`. A run output that is a symbolic link (the run would write through it,
    e.g. ``metrics.json -> ~/.bashrc``) is refused (:class:`UnsafeRunFolder`) unless
    ``overwrite`` removes it (the link, never its target). Leftovers of killed writes are not
    removed here: call :func:`remove_partial_writes` once the run is accepted.

    Args:
        run_dir: the run folder.
        resume: the run continues the one in the folder.
        overwrite: replace an earlier run's outputs.

    Raises:
        RunFolderError: the folder holds a run and neither ``resume`` nor ``overwrite`` is set.
        UnsafeRunFolder: a run output is a symbolic link (and not removed by ``overwrite``).
    """
    run_dir = Path(run_dir)
    links = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).is_symlink()]
    if links and (resume or not overwrite):
        raise UnsafeRunFolder(
            f"{links[0]} is a symbolic link{_target(links[0])}; a run writes its outputs "
            f"itself: remove the link{'' if resume else ' or pass --overwrite'}"
        )
    if resume:
        return
    found = describe_run(run_dir) or (f"symbolic links ({len(links)})" if links else None)
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


class StorageError(RuntimeError):
    """A tune study's storage cannot be used: corrupt, locked, unreachable or edited (exit 1,
    one line naming the URL)."""
