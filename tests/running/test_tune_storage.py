"""``tune`` storage: a real PostgreSQL server shared by two workers, and a killed tune resumed.

The PostgreSQL test gets a database of its own on the session's private server (the
``postgres`` fixture, ``tests/running/conftest.py``); it is skipped, with the reason, where the
PostgreSQL binaries are missing. The two tests of a killed tune share one (:func:`killed_tune`).
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
    from pml_rank_plugins.reporting.tune_report import run_tune
    from tests.running.test_tune import glyph_config
    cfg = glyph_config(epochs=500)  # outlasts the test: killed in its first trial
    cfg["methods"].pop("plugin FastAP")
    run_tune([cfg], sys.argv[1], trials=2)
    """)


def start_slow_tune(out: Path) -> subprocess.Popen:
    """:data:`SLOW_TUNE` into ``out`` in its own session, returned once its first trial wrote a
    checkpoint (so it is in the middle of training)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_TUNE, str(out)],
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


@pytest.fixture(scope="module")
def killed_tune(tmp_path_factory) -> dict:
    """A real ``tune`` (:data:`SLOW_TUNE`, its trial in a spawned worker) killed with ``kill -9``
    in the middle of its first trial: the parent only, as a user kills the command, so the
    worker has to die with it (:mod:`pml_rank_plugins.running.parent`).

    Shared by the two tests below (one Python start with its worker, about 10 s of CPU, for
    both; under ``make test`` they run on one xdist worker): what the kill did, recorded here
    as it happened (``out``, ``parent`` pid, the trial as stored before the kill, whether the
    worker was alive before the kill and still alive 5 s after it), is what
    :func:`test_kill_9_of_tune_leaves_no_worker_behind` checks; the study and folder it left are
    what :func:`test_a_killed_tune_continues_the_trial_in_progress` continues (the only test
    that changes them).
    """
    out = tmp_path_factory.mktemp("killed_tune") / "t"
    proc = start_slow_tune(out)
    try:
        storage = tuning.default_storage(out)
        (trial,) = optuna.load_study(study_name="PML Contrastive", storage=storage).get_trials()
        worker = trial.user_attrs["pid"]
        alive_before = pid_alive(worker)
        proc.kill()  # the parent only, not its process group
        proc.wait()
        deadline = time.time() + 5
        while pid_alive(worker) and time.time() < deadline:
            time.sleep(0.1)
        alive_after = pid_alive(worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker that outlived it: the test says so
    return {
        "out": out,
        "parent": proc.pid,
        "trial": trial,
        "worker_alive_before_the_kill": alive_before,
        "worker_alive_5_s_after_the_kill": alive_after,
    }


@pytest.mark.slow
@pytest.mark.xdist_group("killed_tune")
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_a_killed_tune_continues_the_trial_in_progress(killed_tune):
    # what is under test is what the next tune makes of the study and folder a killed one left,
    # so the next tune trains in this process (the worker's own code)
    out = killed_tune["out"]
    storage = tuning.default_storage(out)
    running = optuna.load_study(study_name="PML Contrastive", storage=storage).get_trials()
    assert [t.state for t in running] == [TrialState.RUNNING]

    # the same budget (a study refuses another config); the pruner, not part of the budget,
    # stops the remaining trials after their first epoch so the test stays quick: every trial,
    # as no MAP@R reaches 1.01 (at 0.99, a run killed some epochs in could pass it on 3
    # validation classes, and train on)
    cfg = contrastive_only(epochs=500)
    cfg["tune"]["pruner"] = {"ThresholdPruner": {"lower": 1.01, "n_warmup_steps": 0}}
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
@pytest.mark.xdist_group("killed_tune")
def test_kill_9_of_tune_leaves_no_worker_behind(killed_tune):
    # Audit 3 item 2: the spawned worker trained on, orphaned, after its parent was killed.
    # The kill and the 5 s wait are killed_tune's, recorded as they happened.
    out, trial = killed_tune["out"], killed_tune["trial"]
    worker = trial.user_attrs["pid"]
    assert worker != killed_tune["parent"] and killed_tune["worker_alive_before_the_kill"]
    assert trial.user_attrs["run_dir"] == str((out / "PML_Contrastive" / "trial0").resolve())
    outlived = killed_tune["worker_alive_5_s_after_the_kill"]
    assert not outlived, "the tune worker outlived its parent by 5 s"
