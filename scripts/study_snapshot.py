"""Carry a running study's Optuna storage across sessions (scripts/run_study.sh snapshot/restore).

A session ends with every process it started, and ``runs/`` is not committed, so the tuning
state would be lost. ``snapshot OUT DOCS`` copies ``OUT/tune/tune.db`` with SQLite's backup API
(a consistent copy while ``tune`` runs) to ``DOCS/tune/tune.db`` and, in the copy only, marks
every RUNNING trial FAIL: those trials die with the session, and on another machine their owner
(pid, host) and absolute run folder would mean nothing. ``restore OUT DOCS`` copies it back when
``OUT/tune/tune.db`` does not exist; ``tune`` then continues the studies (their recorded budget
must match the config: ``bind_budget``).

    python scripts/study_snapshot.py snapshot runs/study docs/study
    python scripts/study_snapshot.py restore runs/study docs/study
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState


def snapshot(out: Path, docs: Path) -> int:
    source = out / "tune" / "tune.db"
    if not source.is_file():
        print(f"study_snapshot: no {source}", file=sys.stderr)
        return 1
    target = docs / "tune" / "tune.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".db.tmp")
    with sqlite3.connect(source) as src, sqlite3.connect(tmp) as dst:
        src.backup(dst)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp.resolve()}")
    failed = 0
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            storage.set_trial_user_attr(t._trial_id, "error", "interrupted: session ended")
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001
            failed += 1
    storage.engine.dispose()
    tmp.replace(target)
    print(f"study_snapshot: {target} ({failed} interrupted trial(s) marked failed)")
    return 0


def restore(out: Path, docs: Path) -> int:
    source, target = docs / "tune" / "tune.db", out / "tune" / "tune.db"
    if target.exists() or not source.is_file():
        print(f"study_snapshot: nothing to restore ({target} exists or {source} missing)")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    print(f"study_snapshot: restored {target} from {source}")
    return 0


if __name__ == "__main__":
    verb, out, docs = sys.argv[1:4]
    sys.exit({"snapshot": snapshot, "restore": restore}[verb](Path(out), Path(docs)))
