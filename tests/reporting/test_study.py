"""``pml-rank study`` end to end on a generated image folder (issue 50's "Done when"): equal-budget tuning, the tuned settings on 2
class-disjoint splits x 2 seeds, the per-split and pooled verdicts in one report; a rerun with
a study killed in its last step continues with ``--resume`` (training only what is missing), a
second ``--resume`` trains nothing, and a study into a used folder is refused without it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import load_yaml
from pml_rank_plugins.reporting import study
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.study_plan import PLAN_FILE
from tests.data.image_folder_fixture import make_image_folder
from tests.running.test_tune import workers_in_process  # noqa: F401 (fixture)
from tests.running.test_tune import trials_of
from tests.tiny import tiny_config

METHODS = ("plugin FastAP", "PML Contrastive")
CLASSES = {"birds": ["owl", "Emu", "kiwi", "tit"], "cats": ["lynx", "Puma", "lion", "ocelot"]}


def folder_study_config(root) -> dict:
    """Two methods on a generated 8-class image folder (8 x 8 grayscale, TinyNet), each with a
    tune space; a trial or run trains 1 epoch x 2 iterations."""
    config = tiny_config(
        trainer={"MetricLossOnly": {"num_epochs": 1, "iterations_per_epoch": 2}},
        tune={
            "trials": 5,  # the command's --trials 2 wins
            "sampler": {"TPESampler": {"seed": 0}},
            "pruner": None,
            "space": {"optimizers.trunk_optimizer.lr": {"float": [1e-3, 1e-1], "log": True}},
        },
    )
    config.pop("loss_funcs")
    config["dataset"] = {
        "ImageFolderDataset": {"root": str(root), "category_folders": True, "mode": "L"}
    }
    config["sampler"] = {"MPerClassSampler": {"m": 3, "length_before_new_iter": 24}}
    config["methods"] = {
        "plugin FastAP": {
            "loss_funcs": {"metric_loss": {"pml_rank_plugins.FastAPLoss": {"num_bins": 10}}},
            "tune": {"space": {"loss_funcs.metric_loss.num_bins": {"int": [5, 20]}}},
        },
        "PML Contrastive": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}},
    }
    return config


@pytest.fixture(scope="module")
def study_args(tmp_path_factory):
    """The command line of a tiny study of a user's image folder (string-named classes under
    category folders, a non-image file and an empty class folder, which the dataset leaves out;
    the broken image that ``check`` names is removed, as its user would): 2 methods x 2 trials,
    then 2 splits x 2 seeds x 2 methods (8 runs), no retrieval pictures."""
    root = tmp_path_factory.mktemp("study")
    gen = make_image_folder(root / "photos", CLASSES, images_per_class=4, size=8)
    gen.broken.unlink()
    path = root / "mine.yaml"
    path.write_text(yaml.safe_dump(folder_study_config(gen.root), sort_keys=False))
    out = root / "out"
    args = ["study", str(path), "--out", str(out), "--trials", "2", "--seeds", "2"]
    return args + ["--splits", "2", "--no-pictures"], out


def run_files(out) -> dict:
    """``{metrics.json path: its bytes}`` of every trial and run under ``out``."""
    return {str(p): p.read_bytes() for p in sorted(out.glob("**/metrics.json"))}


def counting_training(monkeypatch) -> list:
    """Count the trainings (trials and runs: ``runner.train_run``) from here on."""
    calls: list = []
    real = runner.train_run

    def counted(*args, **kwargs):
        calls.append(args[1])  # the run folder
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_run", counted)
    return calls


@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_a_tiny_study_killed_in_a_step_resumes_and_reports_across_splits(
    study_args, capsys, caplog, monkeypatch
):
    args, out = study_args
    caplog.set_level(logging.INFO, logger="pml_rank_plugins.running.study_plan")
    # killed in the last step (split 1) before it trains: the tune and split 0 are done
    real_step = study._split_step

    def killed_at_split_1(selected, out_dir, plan, k, *rest):
        if k == 1:
            raise KeyboardInterrupt
        return real_step(selected, out_dir, plan, k, *rest)

    with monkeypatch.context() as m:
        m.setattr(study, "_split_step", killed_at_split_1)
        with pytest.raises(KeyboardInterrupt):
            main(args)
    assert (out / "split0" / "summary.json").is_file() and not (out / "split1").exists()
    # without --resume the folder is refused before anything trains, naming the fix
    assert main(args) == 2
    assert f"holds a study ({PLAN_FILE}); pass --resume" in capsys.readouterr().err
    # the resume trains split 1's 4 runs only: no trial, nothing of split 0 again
    trained = counting_training(monkeypatch)
    assert main(args + ["--resume"]) == 0
    assert sorted({p.parent.parent.name for p in map(Path, trained)}) == ["split1"]
    assert len(trained) == 4
    printed = capsys.readouterr()
    # the tuning: the same budget for both methods, on the config's own split
    for method in METHODS:
        assert len(trials_of(out / "tune", method)) == 2
    # the tuned settings on split 0 (the config's) and split 1 (split seed + 1), 2 seeds each
    for split in (0, 1):
        summary = json.loads((out / f"split{split}" / "summary.json").read_text())
        assert list(summary["rows"]) == list(METHODS) and summary["seeds"] == 2
        run = load_yaml(out / f"split{split}" / "plugin_FastAP" / "seed1" / "config.yaml")
        assert run["split"]["class_disjoint_split"]["seed"] == split
        changed = {c["key"] for c in summary["budget_changes"].get("plugin FastAP", [])}
        assert changed == ({"split.class_disjoint_split.seed"} if split else set())
    report = json.loads((out / "study.json").read_text())
    across = report["across_splits"]
    assert list(across["splits"]) == ["0", "1"] and across["reference"] == "plugin FastAP"
    assert list(across["rows"]) == ["PML Contrastive"]
    row = across["rows"]["PML Contrastive"]
    # each split's cell is that split's own paired difference (2 seeds), pooled over both
    for split in ("0", "1"):
        summary = json.loads((out / f"split{split}" / "summary.json").read_text())
        d = summary["differences"]["PML Contrastive"]["mean_average_precision_at_r"]
        assert row["splits"][split]["mean"] == pytest.approx(d["mean"], abs=1e-12)
        assert row["splits"][split]["n"] == 2
    assert report["plan"]["split_seeds"] == [0, 1] and report["failed_runs"] == 0
    md = (out / "study.md").read_text()
    assert "## Across splits" in md and "| PML Contrastive | " in md
    assert "split 0 (study), n = 2 | split 1, n = 2 | pooled (95% CI; τ)" in md
    assert "holds across splits" in md and "## Split 1" in md and "## Tuning" in md
    assert (out / "across_splits.png").stat().st_size > 0
    assert md in printed.out  # the report is printed
    assert "study [done]: 12 of 12 trainings done (4 trials, 8 runs)" in caplog.text
    assert "ETA" in caplog.text

    # --resume on the finished study: nothing trains, every run file stays as it was
    before = run_files(out)
    assert len(before) == 4 + 8

    assert main(args + ["--resume"]) == 0
    assert len(trained) == 4  # no new training
    assert run_files(out) == before
    again = json.loads((out / "study.json").read_text())
    assert again["across_splits"] == across
    # a resume that changes the tuning budget is refused, naming the key
    assert main(args + ["--resume", "--trials", "3"]) == 2
    assert "planned with other trials" in capsys.readouterr().err


@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_a_study_whose_trials_all_fail_stops_after_the_tuning_naming_the_methods(
    tmp_path, capsys, monkeypatch
):
    gen = make_image_folder(tmp_path / "photos", CLASSES, images_per_class=4, size=8)
    gen.broken.unlink()
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(folder_study_config(gen.root), sort_keys=False))

    def failing(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(runner, "train_run", failing)
    args = ["study", str(path), "--out", str(tmp_path / "out"), "--trials", "1", "--seeds", "2"]
    assert main(args + ["--no-pictures"]) == 1
    err = capsys.readouterr().err
    assert "pml-rank: error: no complete trial for ['plugin FastAP', 'PML Contrastive']" in err
    assert "tune.md" in err and not (tmp_path / "out" / "split0").exists()
