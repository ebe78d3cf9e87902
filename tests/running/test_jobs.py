"""Jobs of ``compare``/``sweep``: run folders inside ``--out`` and the three kinds of result
(issue 28 items 1, 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.running import jobs as jobs_module
from pml_rank_plugins.running import pool
from pml_rank_plugins.running.run_folder import UnsafeRunFolder
from tests.tiny import tiny_config


def one_epoch(**kw):
    return tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}}, **kw)


def test_make_jobs_keeps_every_run_folder_inside_out(tmp_path):
    out = tmp_path / "out"
    jobs = pool.make_jobs({"A": one_epoch(), "B c": one_epoch()}, out, seeds=2)
    assert [j.run_dir for j in jobs] == [out / "A" / "seed0", out / "A" / "seed1",
                                         out / "B_c" / "seed0", out / "B_c" / "seed1"]  # fmt: skip
    assert all(j.out_dir == out for j in jobs)
    with pytest.raises(ConfigError, match="^run '..': not a safe run folder name"):
        pool.make_jobs({"..": one_epoch()}, out, seeds=1)
    with pytest.raises(ConfigError, match="runs 'x=a/b' and 'x=a b' both map"):  # sweep cells
        pool.make_jobs({"x=a/b": one_epoch(), "x=a b": one_epoch()}, out, seeds=1)
    out.mkdir()
    (out / "A").symlink_to(tmp_path)  # e.g. a run folder received from someone else
    with pytest.raises(UnsafeRunFolder, match=rf"{out / 'A' / 'seed0'} resolves to .*outside"):
        pool.make_jobs({"A": one_epoch()}, out, seeds=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_result_kinds_are_exclusive():
    (job,) = pool.make_jobs({"A": one_epoch()}, Path("out"), seeds=1)
    refused = jobs_module.refused_record(job, RuntimeError("busy"))
    assert refused == {
        "refused": True,
        "name": "A",
        "run_id": "seed0",
        "error": "RuntimeError: busy",
    }
    assert jobs_module.is_refused(refused) and not jobs_module.is_failed(refused)
    for failed in ({"failed": True, "error": "x"}, {"status": "failed", "error": "x"}):
        assert jobs_module.is_failed(failed) and not jobs_module.is_refused(failed)
    finished = {"status": "finished", "test": {}}
    assert not jobs_module.is_failed(finished) and not jobs_module.is_refused(finished)
    assert pool.is_refused is jobs_module.is_refused and pool.Job is jobs_module.Job  # re-exported


def test_run_folders_are_named_after_the_seed_they_hold(tmp_path, caplog):
    # compare --tuned trains on the seeds after the tuning seed: seed 1, 2 -> seed1/, seed2/.
    out = tmp_path / "out"
    jobs = pool.make_jobs({"A": one_epoch(seed=1), "B": one_epoch(seed=1)}, out, seeds=2)
    assert [(j.name, j.run_id, j.config["seed"]) for j in jobs] == [
        ("A", "seed1", 1),
        ("A", "seed2", 2),
        ("B", "seed1", 1),
        ("B", "seed2", 2),
    ]
    assert all(j.run_dir == out / j.name / j.run_id for j in jobs)
    assert "different seeds" not in caplog.text
    # Methods starting from different seeds share no run id (runs are paired by seed): said.
    with caplog.at_level("WARNING", logger="pml_rank_plugins.running.jobs"):
        jobs = pool.make_jobs({"A": one_epoch(seed=0), "B": one_epoch(seed=5)}, out, seeds=1)
    assert [j.run_id for j in jobs] == ["seed0", "seed5"]
    assert "different seeds (A: 0, B: 5)" in caplog.text
