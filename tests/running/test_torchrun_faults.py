"""Audit finding R7: torchrun faults and ``--jobs`` workers.

Each test starts real processes (:mod:`tests.running.fault_scenarios`): two gloo ranks on
loopback with the torchrun environment, or the parent of a ``--jobs 2`` pool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from pml_rank_plugins.running import distributed
from tests.ports import free_port

pytestmark = pytest.mark.slow  # process start-up dominates (a few seconds per test)
REPO = Path(__file__).resolve().parents[2]


def _start(scenario: str, folder: Path, env: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.running.fault_scenarios", scenario, str(folder)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _ranks(scenario: str, folder: Path, **env) -> list[subprocess.Popen]:
    port = free_port()
    return [
        _start(
            scenario,
            folder,
            {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                **env,
            },
        )
        for r in range(2)
    ]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie waits for whoever reaps orphans: it runs no more


def test_R7_stuck_rank_times_out_naming_it(tmp_path):
    rank0, rank1 = _ranks("stuck", tmp_path, PML_RANK_DIST_TIMEOUT="2")
    try:
        out, _ = rank0.communicate(timeout=180)  # a hang guard: start-up alone takes 60 s loaded
        assert rank0.returncode == 1, out
        line = next(ln for ln in out.splitlines() if ln.startswith("ERROR after"))
        seconds = float(line.split()[2])
        assert seconds < 15, line  # 2 s timeout + at most 2 s waiting for reports + training
        assert "rank 0: rank 1 did not answer within the process-group timeout of 2 s" in line
        assert "PML_RANK_DIST_TIMEOUT" in line and "every rank exits" in line
        assert rank1.poll() is None  # stopped: torchrun kills it once rank 0 has exited
    finally:
        for p in (rank0, rank1):
            p.kill()
            p.wait()


def test_R7_compare_and_sweep_under_torchrun_write_from_rank_0_only(tmp_path):
    root = tmp_path / "out"
    procs = _ranks("writers", root)
    outs = [p.communicate(timeout=300)[0] for p in procs]  # a hang guard (80 s seen loaded)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert json.loads((tmp_path / "rank1_writes.json").read_text()) == []
    for f in ("compare/A/seed0/metrics.json", "compare/comparison.md", "sweep/sweep.json"):
        assert (root / f).is_file(), f
    metrics = json.loads((root / "compare/B/seed0/metrics.json").read_text())
    assert metrics["run_info"]["world_size"] == 2


def test_R7_is_main_process_reads_RANK_before_the_group_exists(monkeypatch):
    assert not dist.is_initialized()
    env = {"LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "1")
    assert not distributed.is_main_process()
    monkeypatch.setenv("RANK", "0")
    assert distributed.is_main_process()
    monkeypatch.delenv("RANK")  # not launched by torchrun: one process, the main one
    assert distributed.is_main_process()


def test_R7_eval_is_refused_under_torchrun(monkeypatch):
    distributed.refuse_under_torchrun("eval")  # a plain process: nothing to refuse
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    for key, value in {**env, "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"`pml-rank eval` runs in one process.*started 2"):
        distributed.refuse_under_torchrun("eval")


def test_R7_timeout_setting(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.configured_timeout() == distributed.DEFAULT_TIMEOUT_S == 300
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "7.5")
    assert distributed.configured_timeout() == 7.5
    assert distributed.configured_timeout(3) == 3.0  # setup(timeout=...) wins
    for bad in ("abc", "0", "-1", "inf"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match="PML_RANK_DIST_TIMEOUT"):
            distributed.configured_timeout()


def test_R7_jobs_workers_exit_when_the_parent_dies(tmp_path):
    parent = _start("orphan", tmp_path, {})
    try:
        deadline = time.monotonic() + 180  # three processes start: over 60 s on a loaded machine
        while len(list(tmp_path.glob("worker.*"))) < 2:
            assert parent.poll() is None, parent.communicate()[0]
            assert time.monotonic() < deadline, "the workers did not start training"
            time.sleep(0.2)
        workers = [int(p.suffix[1:]) for p in tmp_path.glob("worker.*")]
        assert parent.pid not in workers and not any(_gone(w) for w in workers)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while not all(_gone(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [w for w in workers if not _gone(w)] == []
    finally:
        parent.kill()
        parent.wait()
        for w in workers if "workers" in locals() else []:
            if not _gone(w):
                os.kill(w, signal.SIGKILL)
