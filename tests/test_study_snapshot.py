"""scripts/study_snapshot.py: the tuning state carried across sessions (running trials failed in
the copy only; restore never overwrites)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "study_snapshot", ROOT / "scripts" / "study_snapshot.py"
)
study_snapshot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_snapshot)


def make_study(out: Path) -> str:
    (out / "tune").mkdir(parents=True)
    url = f"sqlite:///{out / 'tune' / 'tune.db'}"
    study = optuna.create_study(storage=url, study_name="m", direction="maximize")
    study.set_user_attr("config_hash", "sha256:x")
    done = study.ask()
    study.tell(done, 0.5)
    study.ask()  # left RUNNING, as a trial in progress when the session ends
    return url


def states(url: str) -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name="m", storage=url).get_trials()]


def test_snapshot_fails_running_trials_in_the_copy_only_and_restore_brings_it_back(tmp_path):
    out, docs = tmp_path / "runs", tmp_path / "docs"
    url = make_study(out)
    assert study_snapshot.snapshot(out, docs) == 0
    copy = f"sqlite:///{docs / 'tune' / 'tune.db'}"
    assert states(copy) == [TrialState.COMPLETE, TrialState.FAIL]
    assert states(url) == [TrialState.COMPLETE, TrialState.RUNNING]  # the live study untouched
    study = optuna.load_study(study_name="m", storage=copy)
    assert study.user_attrs["config_hash"] == "sha256:x"
    assert study.trials[1].user_attrs["error"] == "interrupted: session ended"

    fresh = tmp_path / "next_session"
    assert study_snapshot.restore(fresh, docs) == 0
    assert states(f"sqlite:///{fresh / 'tune' / 'tune.db'}") == [
        TrialState.COMPLETE,
        TrialState.FAIL,
    ]
    # an existing storage is never overwritten
    assert study_snapshot.restore(out, docs) == 0
    assert states(url) == [TrialState.COMPLETE, TrialState.RUNNING]


def test_snapshot_without_a_study_says_so(tmp_path, capsys):
    assert study_snapshot.snapshot(tmp_path / "none", tmp_path / "docs") == 1
    assert "no " in capsys.readouterr().err
