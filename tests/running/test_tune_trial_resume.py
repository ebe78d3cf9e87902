"""An interrupted tuning trial continues from its checkpoint (running/trial_resume.py, issue 27:
"a study killed at any point resumes with nothing trained twice and nothing lost").

The interruption is built with the tuner's own pieces: a study bound to the method's budget, a
trial asked and recorded as ``tune`` records it (run folder, host, the pid of a process that has
exited), its run trained for one epoch of three and that epoch reported, the trial left RUNNING.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from pml_rank_plugins.experiment.search_space import check_tune_config, suggest
from pml_rank_plugins.reporting.tune_report import collect_tune_methods, run_tune
from pml_rank_plugins.running import runner
from pml_rank_plugins.running import tune as tuning
from pml_rank_plugins.running.study import TuneJob, counted_trials
from pml_rank_plugins.running.trial_resume import RESUMES, continued_trial, requeue_interrupted
from tests.running.test_tune import (  # noqa: F401 (fixtures)
    glyph_config,
    workers_in_process,
)

METHOD = "PML Contrastive"


def config(epochs: int = 3) -> dict:
    cfg = glyph_config(epochs=epochs)
    cfg["methods"].pop("plugin FastAP")
    return cfg


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def interrupted_study(out: Path) -> tuple[optuna.Study, TuneJob, dict, float]:
    """A study whose trial 0 trained 1 epoch of 3 and was killed (RUNNING, owner gone); returns
    the study, its job, the trial's run config and its epoch-1 validation value."""
    spec = collect_tune_methods([config()])[METHOD]
    job = TuneJob(METHOD, spec, 1, tuning.default_storage(out), out)
    out.mkdir(parents=True)
    with tuning.ask_lock(job):
        study = tuning.open_study(job)
        tuning.bind_budget(study, job)
    trial = study.ask()
    params = {p.path: suggest(trial, p) for p in check_tune_config(spec, METHOD).values()}
    run_dir = tuning.trial_folder(job, trial.number)
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", dead_pid())
    trial_config = tuning.trial_config(job, params, trial.number)
    part = runner.train(trial_config, run_dir, stop_after_epoch=1)
    assert part["interrupted_after_epoch"] == 1
    value = part["history"][0]["validation"]["val"]["mean_average_precision_at_r"]
    trial.report(value, 1)
    return study, job, trial_config, value


def val_epochs(run_dir: Path) -> list[int]:
    db = sqlite3.connect(run_dir / "logs" / "logs.db")
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    val = next(t for t in tables if t.endswith("VAL_vs_self"))
    return [r[0] for r in db.execute(f"SELECT epoch FROM {val}")]


@pytest.mark.slow
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_a_killed_trial_continues_from_its_checkpoint_and_equals_an_uninterrupted_one(tmp_path):
    # the continuation trains in this process (the tune worker's own code, without a spawned
    # Python: 4-5 s of CPU less); everything it continues from comes from the folder and the
    # study, as in a new process (the model, optimizer and random state are rebuilt from the
    # checkpoint; a tune killed for real is continued in test_tune_storage.py)
    out = tmp_path / "t"
    study, job, trial_config, first = interrupted_study(out)
    summary = run_tune([config()], out, trials=1)

    trials = optuna.load_study(study_name=METHOD, storage=job.storage).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    old, new = trials
    assert old.user_attrs["error"].startswith("interrupted")
    assert new.user_attrs[RESUMES] == 0 and new.params == old.params
    assert new.user_attrs["run_dir"] == old.user_attrs["run_dir"]  # the same folder, continued
    assert not (out / "PML_Contrastive" / "trial1").exists()
    # the pruner saw the whole curve: epoch 1 replayed from the interrupted trial, then 2 and 3
    assert sorted(new.intermediate_values) == [1, 2, 3] and new.intermediate_values[1] == first
    # nothing trained twice: each epoch validated once in the folder's logs
    assert val_epochs(Path(old.user_attrs["run_dir"])) == [1, 2, 3]
    # nothing lost: the continued trial's value is the uninterrupted run's
    straight = runner.train(trial_config, tmp_path / "straight")
    assert new.value == straight["best"]["value"]
    s = summary["methods"][METHOD]
    assert (s["n_trials"], s["n_interrupted"]) == (1, 1)


def test_requeue_once_only_interrupted_trials_with_a_checkpoint_inside_out(tmp_path):
    out = tmp_path / "t"
    study, job, _, _ = interrupted_study(out)
    assert requeue_interrupted(study, out) == []  # RUNNING: not interrupted (yet)
    assert tuning.fail_interrupted_trials(study, job) == [0]
    # a trial that failed with an outcome is never continued
    failed = study.ask()
    failed.set_user_attr("error", "NonFiniteError: loss is nan")
    failed.set_user_attr("run_dir", str(tuning.trial_folder(job, failed.number)))
    study.tell(failed, state=TrialState.FAIL)
    # an interrupted trial killed before its first checkpoint: nothing to continue
    early = study.ask()
    early.set_user_attr("run_dir", str(tuning.trial_folder(job, early.number)))
    study.tell(early, state=TrialState.FAIL)
    # an interrupted trial whose recorded folder is outside --out (a tampered storage)
    outside = study.ask()
    outside.set_user_attr("run_dir", str(tmp_path / "elsewhere"))
    study.tell(outside, state=TrialState.FAIL)
    (tmp_path / "elsewhere" / "checkpoints").mkdir(parents=True)
    (tmp_path / "elsewhere" / "checkpoints" / "latest.pt").write_bytes(b"")

    before = counted_trials(study)
    assert requeue_interrupted(study, out) == [0]
    assert requeue_interrupted(study, out) == []  # once
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs[RESUMES] == 0
    assert counted_trials(study) == before  # a WAITING continuation counts once asked
    asked = study.ask()
    assert continued_trial(study, asked).number == 0
    space = check_tune_config(job.config, METHOD).values()
    assert {p.path: suggest(asked, p) for p in space} == study.trials[0].params  # the same draw
    assert counted_trials(study) == before + 1
    fresh = study.ask()
    assert continued_trial(study, fresh) is None
