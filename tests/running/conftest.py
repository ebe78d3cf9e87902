"""Fixtures of the ``running`` tests: one private PostgreSQL server per test session.

:func:`postgres_server` starts the server (``initdb`` + ``pg_ctl``) once per session (once per
pytest-xdist worker) in a temporary folder on a free local port, as the unprivileged
``postgres`` user when run as root (``initdb`` refuses root), and stops it when the session
ends; :func:`postgres` gives each test a database of its own on it, so tests stay independent.
Both skip, with the reason, where the binaries are missing.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
_DATABASES = itertools.count()


def as_pg_user(args: list[str]) -> list[str]:
    """``args`` run as ``postgres`` when we are root (initdb and postgres refuse root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


def _pg(*args: str) -> subprocess.CompletedProcess:
    """``PG_BIN/args[0] args[1:]`` as the server's user; a failure raises with its stderr."""
    done = subprocess.run(
        as_pg_user([str(PG_BIN / args[0]), *args[1:]]), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed (exit {done.returncode}):\n{done.stderr}")
    return done


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[int]:
    """A private PostgreSQL server for the session (trust authentication, 127.0.0.1): its port."""
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN} (set PG_BIN)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start postgres unprivileged")
    # pytest's tmp folders are private to root; the server runs as postgres and needs its own
    base = Path(tempfile.mkdtemp(prefix="pml-rank-pg-"))
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    port = free_port()
    try:
        # a throwaway server: no fsync (neither in initdb nor later), nothing to keep on a crash
        _pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync")
        opts = (
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        _pg("pg_ctl", "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start")
        yield port
    finally:
        subprocess.run(
            as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)  # the folder this fixture created


@pytest.fixture
def postgres(postgres_server: int) -> str:
    """A fresh database on :func:`postgres_server`: its URL, with a password trust auth ignores
    (so tests can check it is never written out)."""
    name = f"tune{next(_DATABASES)}"
    _pg("createdb", "-h", "127.0.0.1", "-p", str(postgres_server), "-U", "postgres", name)
    return f"postgresql://postgres:s3cret@127.0.0.1:{postgres_server}/{name}"
