"""The running study's recorded budgets still match what the code computes (issue 30).

``docs/study/tune/tune.db`` records, per method of ``configs/studies/omniglot.yaml``, the hash of
the config its trials were built from (``config_hash`` study attribute). A refactor of how configs
are collected or parsed must leave that hash byte-identical, or ``pml-rank tune`` refuses to
continue the study ("tuned with another config"). The database is copied first and opened
read-only in effect (nothing is written to the copy either).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna

from pml_rank_plugins.experiment.tuned import config_hash
from pml_rank_plugins.reporting.tune_report import collect_tune_methods
from pml_rank_plugins.running.study import TuneJob

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "docs" / "study" / "tune" / "tune.db"
CONFIG = ROOT / "configs" / "studies" / "omniglot.yaml"


def recorded_hashes(tmp_path: Path) -> dict[str, str]:
    copy = tmp_path / "tune.db"
    shutil.copyfile(DB, copy)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{copy}")
    return {
        s.study_name: s.user_attrs["config_hash"]
        for s in optuna.get_all_study_summaries(storage)
        if "config_hash" in s.user_attrs
    }


def test_study_config_hashes_unchanged(tmp_path):
    recorded = recorded_hashes(tmp_path)
    assert recorded, f"{DB}: no study records a config_hash"
    # the study ran with --data-root (budget_config drops it, so any folder gives the same hash)
    selected = collect_tune_methods([CONFIG], (), list(recorded), str(tmp_path))
    for method, want in recorded.items():
        job = TuneJob(method, selected[method], 1, "sqlite://", tmp_path)
        assert config_hash(job.budget[0]) == want, method
