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
