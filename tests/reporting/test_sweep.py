"""``pml-rank sweep``: grid cells x paired seeds, outputs, ``--resume`` skips finished runs,
failed cells are reported without aborting, grid mistakes fail fast."""

from __future__ import annotations

import csv
import json

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import ConfigError, dump_yaml
from pml_rank_plugins.reporting import sweep
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.run_folder import RunFolderError
from tests.reporting.test_compare import CrashingLoss  # noqa: F401 -- registers CrashingLoss
from tests.tiny import tiny_config

FAST = ["--set", "trainer.iterations_per_epoch=2", "--set", "trainer.num_epochs=1"]


@pytest.fixture
def config_file(tmp_path):
    cfg = tiny_config()
    cfg["methods"] = {
        "Contrastive": None,
        "Crashy": {"loss_funcs": {"metric_loss": {"CrashingLoss": {"crash_at": 1000}}}},
    }
    path = tmp_path / "sweep.yaml"
    dump_yaml(cfg, path)
    return path


def test_parse_grid_and_cells():
    grid = sweep.parse_grid(["loss_funcs.metric_loss.neg_margin=0.5,1.0", "trainer.batch_size=12"])
    assert grid == {
        "loss_funcs.metric_loss.neg_margin": ["0.5", "1.0"],
        "trainer.batch_size": ["12"],
    }
    assert list(sweep.grid_cells(grid)) == [
        "neg_margin=0.5,batch_size=12",
        "neg_margin=1.0,batch_size=12",
    ]
    for bad, msg in [
        (["lr"], "expected KEY=V1,V2"),
        (["a=1", "a=2"], "given twice"),
        (["a=1,1"], "repeated value"),
        ([], "at least one --grid"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            sweep.parse_grid(bad)


@pytest.mark.slow
def test_sweep_writes_tables_and_plot_and_resume_skips_finished_runs(
    tmp_path, config_file, monkeypatch, capsys, png_plots_only
):
    out = tmp_path / "sw"
    args = ["sweep", str(config_file), "--method", "Contrastive", "--out", str(out), "--seeds", "2"]
    args += ["--grid", "loss_funcs.metric_loss.neg_margin=0.5,1.0", "--reference", "neg_margin=1.0"]
    assert main(args + FAST) == 0
    printed = capsys.readouterr().out
    for f in ("sweep.md", "sweep.csv", "sweep.json", "sweep_loss_funcs.metric_loss.neg_margin.png"):
        assert (out / f).is_file(), f
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["reference"] == "neg_margin=1.0" and summary["method"] == "Contrastive"
    assert list(summary["rows"]) == ["neg_margin=0.5", "neg_margin=1.0"]
    diff = summary["differences"]["neg_margin=0.5"]["mean_average_precision_at_r"]
    assert diff["n"] == 2 and diff["run_ids"] == ["seed0", "seed1"]
    md = (out / "sweep.md").read_text()
    assert md.startswith("| cell | n |") and md in printed
    assert [r["cell"] for r in csv.DictReader(open(out / "sweep.csv"))] == list(summary["rows"])
    # The cell's override reached the loss; seeds are paired across cells.
    cfg = (out / "neg_margin_0.5" / "seed1" / "config.yaml").read_text()
    assert "neg_margin: 0.5" in cfg and "seed: 1" in cfg

    # --resume: every run is finished, so nothing trains and the tables are the same.
    def no_training(*a, **k):
        raise AssertionError("--resume retrained a finished run")

    monkeypatch.setattr(runner, "train", no_training)
    assert main(args + FAST + ["--resume"]) == 0
    again = json.loads((out / "sweep.json").read_text())
    assert again["rows"]["neg_margin=0.5"] == summary["rows"]["neg_margin=0.5"]
    # ... and the resume adds its seconds to those of the command that trained the runs
    first, second = again["commands"]
    assert first == summary["commands"][0] and first["total_wall_seconds"] > 0
    assert first["pictures_seconds"] == 0.0  # `pml-rank sweep` draws no retrieval pictures
    assert again["total_wall_seconds"] == first["total_wall_seconds"] + second["total_wall_seconds"]
    assert again["pictures_seconds"] == first["pictures_seconds"] + second["pictures_seconds"]
    # Only an unfinished run is retrained.
    (out / "neg_margin_1.0" / "seed0" / "metrics.json").unlink()
    monkeypatch.undo()
    calls = []
    real_train = runner.train
    monkeypatch.setattr(
        runner, "train", lambda cfg, d, **k: calls.append(d) or real_train(cfg, d, **k)
    )
    assert main(args + FAST + ["--resume"]) == 0
    assert calls == [out / "neg_margin_1.0" / "seed0"]


def test_failed_cell_is_reported_and_other_cells_complete(tmp_path, config_file, png_plots_only):
    out = tmp_path / "sw"
    summary = sweep.run_sweep(
        config_file,
        "Crashy",
        ["loss_funcs.metric_loss.crash_at=1000,1"],
        out,
        seeds=1,
        overrides=FAST[1::2],
    )
    assert [(f["cell"], f["run_id"]) for f in summary["failed"]] == [("crash_at=1", "seed0")]
    assert summary["rows"]["crash_at=1000"]["precision_at_1"]["n"] == 1
    assert (
        "| crash_at=1 | 0 (1 failed) | failed: RuntimeError: boom" in (out / "sweep.md").read_text()
    )


def test_grid_mistakes_fail_fast(tmp_path, config_file, capsys):
    out = tmp_path / "sw"
    base = ["sweep", str(config_file), "--out", str(out)] + FAST
    assert main(base + ["--grid", "trainer.batch_size=12"]) == 2  # two methods, none picked
    assert "pick one: --method" in capsys.readouterr().err
    bad = ["--method", "Contrastive", "--grid", "loss_funcs.metric_loss.nope=1,2"]
    assert main(base + bad) == 2
    assert "nope" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_second_sweep_into_a_used_folder_is_refused_unless_overwrite(
    tmp_path, config_file, png_plots_only
):
    out = tmp_path / "sw"
    grid = ["loss_funcs.metric_loss.neg_margin=0.5"]
    first = sweep.run_sweep(config_file, "Contrastive", grid, out, overrides=FAST[1::2])
    with pytest.raises(RunFolderError, match="1 run folder.*--overwrite"):
        sweep.run_sweep(config_file, "Contrastive", grid, out, overrides=FAST[1::2])
    again = sweep.run_sweep(
        config_file, "Contrastive", grid, out, overrides=FAST[1::2], overwrite=True
    )
    assert again["rows"].keys() == first["rows"].keys() and not again["failed"]
    assert (out / "neg_margin_0.5" / "seed0" / "metrics.json").is_file()


def test_a_prepared_sweep_is_not_collected_again(
    tmp_path, config_file, monkeypatch, png_plots_only
):
    grid = ["loss_funcs.metric_loss.neg_margin=0.5,1.0"]
    prepared = sweep.prepare_sweep(config_file, "Contrastive", grid, FAST[1::2])
    assert list(prepared[3]) == ["neg_margin=0.5", "neg_margin=1.0"]
    assert prepared[3]["neg_margin=0.5"]["loss_funcs"]["metric_loss"]["ContrastiveLoss"] == {
        "neg_margin": 0.5
    }

    def collected_again(*a, **k):
        raise AssertionError("run_sweep collected the cells again")

    monkeypatch.setattr(sweep, "prepare_sweep", collected_again)
    out = tmp_path / "sw"
    summary = sweep.run_sweep(config_file, "Contrastive", grid, out, prepared=prepared)
    assert not summary["failed"] and list(summary["rows"]) == list(prepared[3])
