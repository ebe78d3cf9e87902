"""``tune`` storage: a real PostgreSQL server shared by two workers, and a killed tune resumed.

The PostgreSQL test gets a database of its own on the session's private server (the
``postgres`` fixture, ``tests/running/conftest.py``); it is skipped, with the reason, where the
PostgreSQL binaries are missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from pml_rank_plugins.reporting.tune_report import run_tune
from pml_rank_plugins.running import tune as tuning
from pml_rank_plugins.running.parent import pid_alive
from tests.running.test_tune import (  # noqa: F401 (fixtures)
    glyph_config,
    png_plots_only,
    workers_in_process,
)

ROOT = Path(__file__).resolve().parents[2]


def contrastive_only(**kw) -> dict:
    cfg = glyph_config(**kw)
    cfg["methods"].pop("plugin FastAP")
    return cfg


@pytest.mark.slow
@pytest.mark.usefixtures("png_plots_only")
def test_postgresql_study_shared_by_two_workers(postgres, tmp_path):
    cfg = contrastive_only(epochs=1)  # what is under test is the storage, not the training
    summary = run_tune([cfg], tmp_path / "t", trials=4, storage=postgres, jobs=2)
    s = summary["methods"]["PML Contrastive"]
    assert s["n_trials"] == 4 and s["states"] == {"complete": 4}
    assert "s3cret" not in (tmp_path / "t" / "tune.json").read_text()  # password removed
    assert summary["storage"].startswith("postgresql://postgres:***@127.0.0.1")
    study = optuna.load_study(study_name="PML Contrastive", storage=postgres)
    assert sorted(t.number for t in study.get_trials()) == [0, 1, 2, 3]
    assert not (tmp_path / "t" / "tune.db").exists()  # nothing went to the default SQLite


SLOW_TUNE = textwrap.dedent("""
    import sys
    import torch
    from pml_rank_plugins.reporting.tune_report import run_tune
    from pml_rank_plugins.running import tune as tuning
    from tests.running.test_tune import glyph_config
    if sys.argv[2] == "in-process":  # the worker's own code, in this process (no spawn)
        tuning._run_workers = lambda job, jobs: tuning._worker(job, 0, torch.get_num_threads(), {})
    cfg = glyph_config(epochs=40)
    cfg["methods"].pop("plugin FastAP")
    run_tune([cfg], sys.argv[1], trials=2)
    """)


def start_slow_tune(out: Path, workers: str = "spawn") -> subprocess.Popen:
    """:data:`SLOW_TUNE` into ``out`` in its own session, returned once its first trial wrote a
    checkpoint (so it is in the middle of training). ``workers="in-process"``: the trial trains
    in the tune process itself instead of a spawned worker (one Python start, 4-5 s of CPU, less;
    killing the process group leaves the study and the run folder as with a worker: the trial
    RUNNING, its recorded owner gone, its folder's lock free)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_TUNE, str(out), workers],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (out / "PML_Contrastive" / "trial0" / "checkpoints" / "latest.pt").exists():
        if time.time() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("the slow tune ended early or never wrote its first checkpoint")
        time.sleep(0.2)
    return proc


@pytest.mark.slow
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_a_killed_tune_continues_the_trial_in_progress(tmp_path):
    # a real process killed in the middle of a trial; what is under test is what the next tune
    # makes of the study and folder it left (the kill of a tune with a spawned worker:
    # test_kill_9_of_tune_leaves_no_worker_behind), so both tunes train in their own process
    out = tmp_path / "t"
    proc = start_slow_tune(out, workers="in-process")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    storage = tuning.default_storage(out)
    running = optuna.load_study(study_name="PML Contrastive", storage=storage).get_trials()
    assert [t.state for t in running] == [TrialState.RUNNING]

    # the same budget (a study refuses another config); the pruner, not part of the budget,
    # stops the remaining trials after their first epoch so the test stays quick
    cfg = contrastive_only(epochs=40)
    cfg["tune"]["pruner"] = {"ThresholdPruner": {"lower": 0.99, "n_warmup_steps": 0}}
    summary = run_tune([cfg], out, trials=3)
    trials = optuna.load_study(study_name="PML Contrastive", storage=storage).get_trials()
    # the killed trial is recorded failed (interrupted) and does not count toward --trials:
    # every method of a study gets the same number of trials with an outcome (issue 27) ...
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.PRUNED] * 3
    assert trials[0].user_attrs["error"].startswith("interrupted: its process")
    assert summary["methods"]["PML Contrastive"]["n_trials"] == 3
    assert summary["methods"]["PML Contrastive"]["n_interrupted"] == 1
    assert summary["methods"]["PML Contrastive"]["states"] == {"fail": 1, "pruned": 3}
    # ... and trial 1 continued it, in its folder, with its parameters (trial_resume.py)
    assert trials[1].user_attrs["resumes"] == 0 and trials[1].params == trials[0].params
    assert trials[1].user_attrs["run_dir"] == trials[0].user_attrs["run_dir"]
    # fresh trials got fresh folders; no folder for the continuation
    assert sorted(p.name for p in (out / "PML_Contrastive").iterdir()) == [
        "trial0",
        "trial2",
        "trial3",
    ]
    assert (out / "PML_Contrastive" / "trial2" / "checkpoints" / "latest.pt").exists()


@pytest.mark.slow
def test_kill_9_of_tune_leaves_no_worker_behind(tmp_path):
    # Audit 3 item 2: the spawned worker trained on, orphaned, after its parent was killed.
    out = tmp_path / "t"
    proc = start_slow_tune(out)
    try:
        storage = tuning.default_storage(out)
        (trial,) = optuna.load_study(study_name="PML Contrastive", storage=storage).get_trials()
        worker = trial.user_attrs["pid"]
        assert worker != proc.pid and pid_alive(worker)
        assert trial.user_attrs["run_dir"] == str((out / "PML_Contrastive" / "trial0").resolve())
        proc.kill()  # the parent only, not its process group
        proc.wait()
        deadline = time.time() + 5
        while pid_alive(worker) and time.time() < deadline:
            time.sleep(0.1)
        assert not pid_alive(worker), "the tune worker outlived its parent by 5 s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
