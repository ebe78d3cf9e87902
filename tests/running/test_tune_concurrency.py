"""Concurrent ``pml-rank tune`` commands on one ``--out`` (third audit, item 4 and item 11).

Every test with a live trial runs real ``python -m pml_rank_plugins tune`` processes on a tiny
contrastive-only glyph config, because what is under test is between processes: a trial's owner
is a spawned worker of one command, and the other command only sees it through the storage and
the run folder's lock. A command that trains nothing runs in this process
(:func:`run_tune_in_process`: a Python start, 4-5 s of CPU, less): one refused before any trial
trains, judging a trial whose owner is already dead, and one that finds the only trial live in
another command's worker (it still sees that worker only through the storage and the lock).

Exit status of an owner whose trial another command marked finished: its worker logs one line
(``trial K was finished by another command``) and stops asking; the command itself then reports
the study as usual, so its exit status follows the study: 0 when the study holds a complete
trial, 1 (``no complete trial``) otherwise. In the test below the stolen trial is the only one,
so the owner exits 1.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.methods import slug
from pml_rank_plugins.reporting.tune_report import collect_tune_methods
from pml_rank_plugins.running import run_folder
from pml_rank_plugins.running import tune as tuning
from pml_rank_plugins.running.checkpoints import load_checkpoint
from pml_rank_plugins.running.parent import pid_alive
from tests.running.test_tune_storage import contrastive_only

METHOD = "PML Contrastive"
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def write_config(path: Path, epochs: int) -> Path:
    path.write_text(yaml.safe_dump(contrastive_only(epochs=epochs), sort_keys=False))
    return path


def tune_command(config: Path, out: str | Path, trials: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pml_rank_plugins",
        "tune",
        str(config),
        "--out",
        str(out),
        "--trials",
        str(trials),
    ]


def start_tune(config: Path, out: str | Path, trials: int, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        tune_command(config, out, trials),
        cwd=cwd,
        env=ENV,
        start_new_session=True,  # its own process group: killed as a whole on failure
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_tune_in_process(config: Path, out: str | Path, trials: int, cwd: Path, monkeypatch, capsys):
    """``pml-rank tune`` as :func:`start_tune` runs it (from ``cwd``), but in this process;
    ``(exit status, stderr)``. Only for a command that trains nothing (no worker is spawned).
    Its log lines go to pytest's log capture here (the root logger has pytest's handler, so the
    CLI's ``logging.basicConfig`` adds no stderr handler): check ``caplog.text`` as well."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    rc = main(tune_command(config, out, trials)[3:])  # without "python -m pml_rank_plugins"
    return rc, capsys.readouterr().err


def wait_for_first_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    latest = out / slug(METHOD) / "trial0" / "checkpoints" / "latest.pt"
    deadline = time.time() + timeout
    while not latest.exists():
        assert time.time() < deadline, "the first trial never wrote a checkpoint"
        assert proc.poll() is None, f"the tune process ended early: {proc.communicate()[1]}"
        time.sleep(0.2)


@contextlib.contextmanager
def killed_at_exit(proc: subprocess.Popen):
    """Yield ``proc``; at exit kill its process group if it still runs, and keep its
    ``(stdout, stderr)`` as ``proc.output``."""
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.output = proc.communicate()


def study_trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=METHOD, storage=tuning.default_storage(out))
    return sorted(study.get_trials(), key=lambda t: t.number)


def files_under(folder: Path, but: Path | None = None) -> set[Path]:
    """Every path below ``folder`` except those below ``but``."""
    return {p for p in folder.rglob("*") if but is None or not p.is_relative_to(but)}


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow  # a tune command in a subprocess (about 10 s to start with its worker)
@pytest.mark.usefixtures("png_plots_only")  # the second command's (this process's) plots
def test_cross_directory_tune_leaves_the_live_trial_alone(tmp_path, monkeypatch, capsys, caplog):
    # Audit 3 item 4: `run_dir` was stored relative, so a second `tune` from another directory
    # found no lock, marked the live trial FAIL and created trial0/.lock outside --out; the
    # owner then died with UpdateFinishedTrialError at its next epoch's report.
    config = write_config(tmp_path / "c.yaml", epochs=500)  # outlasts the test: killed below
    first_cwd, second_cwd = tmp_path / "a", tmp_path / "b"
    first_cwd.mkdir()
    second_cwd.mkdir()
    out = first_cwd / "runs"
    with killed_at_exit(start_tune(config, "runs", 1, cwd=first_cwd)) as owner:
        wait_for_first_checkpoint(out, owner)
        (trial,) = study_trials(out)
        assert trial.user_attrs["run_dir"] == str((out / slug(METHOD) / "trial0").resolve())
        assert trial.user_attrs["host"] == socket.gethostname()

        # the second command, in this process: it sees the owner only through the storage and
        # the trial folder's lock, as from a process of its own
        rc, stderr = run_tune_in_process(config, "../a/runs", 1, second_cwd, monkeypatch, capsys)
        stderr += caplog.text  # its log lines (run_tune_in_process)
        # the second command counted the live trial as running, trained nothing, and has no
        # complete trial to report
        summary = json.loads((out / "tune.json").read_text())["methods"][METHOD]
        assert summary["states"] == {"running": 1}, stderr
        assert rc == 1, stderr
        assert "no complete trial" in stderr and "interrupted" not in stderr
        no_traceback(stderr)
        assert list(second_cwd.iterdir()) == []  # nothing created in the second's directory

        # the owner goes on: it reports a further epoch to the study after the second ended
        (trial,) = study_trials(out)
        reported = max(trial.intermediate_values)
        deadline = time.time() + 60
        while max(trial.intermediate_values) <= reported:
            assert time.time() < deadline, "the owner reported no epoch after the second tune"
            assert owner.poll() is None, owner.communicate()[1]
            time.sleep(0.2)
            (trial,) = study_trials(out)
        assert trial.state == TrialState.RUNNING
    no_traceback(owner.output[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c.yaml"]
    assert [p.name for p in first_cwd.iterdir()] == ["runs"]
    assert sorted(p.name for p in (out / slug(METHOD)).iterdir()) == ["trial0"]


@pytest.mark.slow  # tune commands in subprocesses (about 10 s each to start)
def test_two_tunes_started_together_on_a_fresh_out(tmp_path):
    # Audit 3 item 9: two `tune`s started 1 s apart on a fresh --out gave "table trials
    # already exists". The storage is created once, under the ask lock; the trials are shared.
    config = write_config(tmp_path / "c.yaml", epochs=1)
    out = tmp_path / "t"
    procs = [start_tune(config, out, 2, cwd=tmp_path) for _ in range(2)]
    results = []
    with killed_at_exit(procs[0]), killed_at_exit(procs[1]):
        for proc in procs:
            results.append((*proc.communicate(timeout=180), proc.returncode))
    for _, stderr, rc in results:
        assert rc == 0, stderr
        no_traceback(stderr)
    trials = study_trials(out)
    assert [t.number for t in trials] == [0, 1]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == 2
    assert sorted(p.name for p in (out / slug(METHOD)).iterdir()) == ["trial0", "trial1"]


def _open_together(configs: dict, out: Path, barrier, results) -> None:
    """A forked ``tune`` that opens the storage and trains nothing, after ``barrier``."""
    tuning._run_workers = lambda job, jobs: None  # this child only
    barrier.wait()
    try:
        tuning.tune(configs, out, trials=1)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 -- reported to the test
        results.put(f"{type(e).__name__}: {e}")


def test_four_tunes_opening_a_fresh_storage_at_once_all_work(tmp_path):
    # The same race as above, made likely: without the ask lock around creating the storage,
    # processes released together by a barrier failed 2 times in 3 with "table ... already
    # exists" or "UNIQUE constraint failed: alembic_version".
    configs = collect_tune_methods([contrastive_only()])
    out = tmp_path / "t"
    ctx = mp.get_context("fork")  # quick: nothing to import again
    barrier, results = ctx.Barrier(4), ctx.Queue()
    args = (configs, out, barrier, results)
    procs = [ctx.Process(target=_open_together, args=args) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [results.get(timeout=5) for _ in procs] == ["ok"] * 4
    study = optuna.load_study(study_name=METHOD, storage=tuning.default_storage(out))
    assert "config_hash" in study.user_attrs and study.get_trials() == []


@pytest.mark.slow  # tune commands in subprocesses (about 10 s each to start)
def test_a_trial_failed_by_another_command_stops_its_owner_with_one_line(tmp_path):
    # Audit 3 item 4: the owner of a trial that another command marked FAIL died with an
    # UpdateFinishedTrialError traceback (or "Cannot tell a FAIL trial").
    config = write_config(tmp_path / "c.yaml", epochs=500)  # outlasts the test under any load
    out = tmp_path / "t"
    with killed_at_exit(start_tune(config, out, 1, cwd=tmp_path)) as owner:
        wait_for_first_checkpoint(out, owner)
        storage = optuna.storages.RDBStorage(tuning.default_storage(out))
        study_id = storage.get_study_id_from_name(METHOD)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, 0)
        assert storage.set_trial_state_values(trial_id, TrialState.FAIL)  # "another command"
        stdout, stderr = owner.communicate(timeout=60)
    lines = [line for line in stderr.splitlines() if "finished" in line or "failed" in line]
    assert len(lines) == 1, stderr  # no "training failed" line from the run itself
    assert f"[{METHOD}] trial 0 was finished by another command" in lines[0]
    assert lines[0].endswith("this worker stops")
    no_traceback(stderr)
    # exit status follows the study (module docstring): its only trial is not complete
    assert owner.returncode == 1
    assert stderr.splitlines()[-1] == f"pml-rank: no complete trial for ['{METHOD}']; see tune.md"
    (trial,) = study_trials(out)
    assert trial.state == TrialState.FAIL
    # the run stopped after the next epoch's checkpoint instead of training all 500, and its
    # folder is left as a killed run's (no failure record: the study says why it ended)
    folder = out / slug(METHOD) / "trial0"
    assert load_checkpoint(folder / "checkpoints" / "latest.pt")["epoch"] < 500
    assert not (folder / "metrics.json").exists()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


@pytest.mark.parametrize("where", ["absolute elsewhere", "../../x"])
@pytest.mark.slow
def test_tampered_run_dir_outside_out_is_refused(tmp_path, where, monkeypatch, capsys):
    # Audit 3 item 11: a RUNNING trial whose run_dir is absolute elsewhere or `../../x` made
    # `tune` create that tree and a `.lock` outside --out.
    config = write_config(tmp_path / "c.yaml", epochs=1)
    cwd = tmp_path / "w" / "d"
    cwd.mkdir(parents=True)
    out = cwd / "out"
    if where == "absolute elsewhere":
        run_dir = str(tmp_path / "elsewhere" / "trial0")
    else:
        run_dir = where
    # the study as `tune` leaves it (config recorded), then a trial edited into it
    (cfg,) = collect_tune_methods([config]).values()
    job = tuning.TuneJob(METHOD, cfg, 2, tuning.default_storage(out), out)
    with tuning.ask_lock(job):  # as `tune` does: creates --out, then the storage
        study = tuning.open_study(job)
        tuning.bind_budget(study, job)
    trial = study.ask()
    trial.set_user_attr("run_dir", run_dir)
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", dead_pid())
    before = files_under(tmp_path, but=out)

    # the trial's owner is dead: nothing between processes is left to test, so no subprocess
    rc, stderr = run_tune_in_process(config, out, 2, cwd, monkeypatch, capsys)
    assert rc == 1, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("pml-rank: error: ")
    assert f"run_dir {run_dir!r} is not inside --out" in stderr
    assert files_under(tmp_path, but=out) == before  # nothing created outside --out
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "x").exists()
    assert not (out / slug(METHOD)).exists()  # and no trial trained
    (trial,) = study_trials(out)
    assert trial.state == TrialState.RUNNING  # left as it was


def bound_study(out: Path, trials: int = 1) -> tuple[tuning.TuneJob, optuna.Study]:
    """The study as ``tune`` opens it (storage created, budget recorded), with no trial."""
    (cfg,) = collect_tune_methods([contrastive_only()]).values()
    job = tuning.TuneJob(METHOD, cfg, trials, tuning.default_storage(out), out)
    with tuning.ask_lock(job):
        study = tuning.open_study(job)
        tuning.bind_budget(study, job)
    return job, study


@pytest.mark.parametrize(
    "owner, folder, failed",
    [
        ("alive", "free", False),  # e.g. asked by another command, lock not taken yet
        ("dead", "locked", False),  # the folder's lock says a live run still trains it
        ("dead", "free", True),
        ("zombie", "free", True),  # dead, not yet reaped
        ("dead, other host", "free", False),  # left to its own machine
    ],
)
def test_an_interrupted_trial_is_failed_only_when_its_owner_is_gone_and_its_folder_free(
    tmp_path, owner, folder, failed
):
    job, study = bound_study(tmp_path / "t")
    trial = study.ask()
    run_dir = tuning.trial_folder(job, trial.number)
    child = subprocess.Popen(["true"])
    if owner == "zombie":
        while not Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].startswith(" Z"):
            time.sleep(0.01)  # exited; Popen reaps it only in wait/poll
    else:
        child.wait()
    pid = os.getpid() if owner == "alive" else child.pid
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("host", "elsewhere" if "other host" in owner else socket.gethostname())
    trial.set_user_attr("pid", pid)
    try:
        with contextlib.ExitStack() as stack:
            if folder == "locked":
                stack.enter_context(run_folder.lock(run_dir))
            assert tuning.fail_interrupted_trials(study, job) == ([0] if failed else [])
    finally:
        child.wait()
    expected = TrialState.FAIL if failed else TrialState.RUNNING
    assert study.get_trials()[0].state == expected


def test_a_trial_finished_by_another_command_before_its_tell_stops_the_worker(
    tmp_path, monkeypatch, caplog
):
    # the last moment the owner can find out: after training, when it records and tells
    job, study = bound_study(tmp_path / "t", trials=2)
    storage = optuna.storages.RDBStorage(job.storage)

    def trained_while_failed_elsewhere(trial, config, run_dir, device, resume=False):
        study_id = storage.get_study_id_from_name(METHOD)
        storage.set_trial_state_values(
            storage.get_trial_id_from_study_id_trial_number(study_id, trial.number),
            TrialState.FAIL,
        )
        return 0.5

    monkeypatch.setattr(tuning, "train_trial", trained_while_failed_elsewhere)
    assert tuning.run_trials(job) == 0  # no further trial asked
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(
        f"[{METHOD}] trial 0 was finished by another command"
    )
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL]


def test_interrupted_trials_are_judged_under_the_ask_lock(tmp_path, monkeypatch):
    # Audit 3 item 4, the same-directory race: between `study.ask()` and recording its owner,
    # a trial has a run_dir but no pid; another `tune` judging it then would mark it FAIL.
    # `_ask` records the owner under the ask lock, so `tune` must judge under it too.
    judged_with_lock_held = []
    real = tuning.fail_interrupted_trials

    def spy(study, job):
        fd = os.open(job.out_dir / tuning.ASK_LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: must block
            judged_with_lock_held.append(False)
        except BlockingIOError:
            judged_with_lock_held.append(True)
        finally:
            os.close(fd)
        return real(study, job)

    monkeypatch.setattr(tuning, "fail_interrupted_trials", spy)
    monkeypatch.setattr(tuning, "_run_workers", lambda job, jobs: None)
    tuning.tune(collect_tune_methods([contrastive_only()]), tmp_path / "t", trials=1)
    assert judged_with_lock_held == [True]
