"""running/workers.py: workers forked from the package's forkserver get what a spawned worker
gets (the pool's environment and standard streams at its start, a fresh NumPy random state, no
CUDA state), and a forkserver started by other code is not used."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from pml_rank_plugins.running import workers


def _probe(tag: str) -> dict:
    print(f"worker {tag} wrote this", flush=True)
    return {
        "pid": os.getpid(),
        "env": os.environ.get("PML_RANK_TEST_WORKERS"),
        "tqdm": os.environ.get("TQDM_DISABLE"),
        "draw": float(np.random.random()),
        "cuda_initialized": torch.cuda.is_initialized(),
        "bad_fork": torch.cuda._is_in_bad_fork(),  # noqa: SLF001 -- set when CUDA state was forked
        "preloaded": "pml_rank_plugins.running.pool" in sys.modules,
    }


def _worker(state: dict, tag: str, results) -> None:
    workers.adopt_parent(state)  # first thing, as the pools' initializers do
    results.put(_probe(tag))


def _pool_results(ctx, n: int = 2) -> list[dict]:
    """``n`` worker processes of ``ctx`` started as the pools start theirs; what each saw."""
    state = workers.parent_state(TQDM_DISABLE="1")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(state, str(k), results)) for k in range(n)]
    for p in procs:
        p.start()
    found = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r["pid"])
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return found


@pytest.fixture(scope="module")
def server_started_before():
    """The package's forkserver, started before the test's ``capfd`` and environment."""
    return workers.context()


def test_forked_workers_get_the_pools_environment_streams_and_fresh_random_state(
    server_started_before, monkeypatch, capfd
):
    ctx = workers.context()
    assert ctx is server_started_before and ctx.get_start_method() == "forkserver"
    monkeypatch.setenv("PML_RANK_TEST_WORKERS", "set after the server started")
    results = _pool_results(ctx)
    assert all(r["env"] == "set after the server started" and r["tqdm"] == "1" for r in results)
    assert all(r["preloaded"] for r in results)
    assert all(not r["cuda_initialized"] and not r["bad_fork"] for r in results)
    assert len({r["pid"] for r in results}) == 2 and os.getpid() not in {r["pid"] for r in results}
    assert results[0]["draw"] != results[1]["draw"]  # not the server's one NumPy state
    out = capfd.readouterr().out  # the worker's stdout is this process's (captured) fd 1
    assert "worker 0 wrote this" in out and "worker 1 wrote this" in out
    monkeypatch.delenv("PML_RANK_TEST_WORKERS")
    assert all(r["env"] is None for r in _pool_results(ctx))  # and removed again


def test_a_forkserver_started_by_other_code_is_not_used(monkeypatch):
    assert workers.context().get_start_method() == "forkserver"
    # as if the running server were not this module's (another preload, another environment)
    monkeypatch.setitem(workers._STARTED, "server", -1)  # noqa: SLF001
    ctx = workers.context()
    assert ctx.get_start_method() == "spawn"
    assert _pool_results(ctx, n=1)[0]["env"] is None
