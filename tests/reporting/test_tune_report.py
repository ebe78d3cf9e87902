"""``pml-rank tune`` and ``compare --tuned`` through the CLI, and the tune outputs."""

from __future__ import annotations

import datetime
import json

import optuna
import pytest
import yaml

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import load_yaml
from pml_rank_plugins.reporting.tune_report import markdown
from pml_rank_plugins.running.study import is_interrupted, study_summary
from tests.running.test_tune import (  # noqa: F401 (fixtures)
    glyph_config,
    workers_in_process,
)
from tests.tiny import tiny_config


def write(path, config) -> str:
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.slow
# the tune's trials train in this process (the worker's own code; spawned workers: the tune
# tests in tests/running), and no PDF copies of the plots: what is under test is the runs' configs
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")
def test_tune_then_compare_tuned_uses_the_best_parameters_on_fresh_seeds(tmp_path, capsys):
    cfg = glyph_config(epochs=1)  # what is under test is which parameters the runs get
    cfg["methods"].pop("PML Contrastive")
    path = write(tmp_path / "c.yaml", cfg)
    assert main(["tune", path, "--out", str(tmp_path / "t"), "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "| plugin FastAP |" in out and "0 failed trial(s), 0 interrupted (not counted)" in out
    tuned = json.loads((tmp_path / "t" / "tune.json").read_text())
    best = tuned["methods"]["plugin FastAP"]["best_params"]
    assert tuned["methods"]["plugin FastAP"]["n_trials"] == 2

    args = ["compare", path, "--tuned", str(tmp_path / "t"), "--out", str(tmp_path / "c")]
    # no retrieval pictures (reporting/test_retrieval.py): what is under test is the runs' configs
    assert main(args + ["--seeds", "2", "--no-pictures"]) == 0
    for i in range(2):
        seed = cfg["seed"] + 1 + i  # fresh: every trial trained with seed 0
        run = load_yaml(tmp_path / "c" / "plugin_FastAP" / f"seed{seed}" / "config.yaml")
        opt = run["optimizers"]["trunk_optimizer"]["Adam"]["lr"]
        bins = run["loss_funcs"]["metric_loss"]["pml_rank_plugins.FastAPLoss"]["num_bins"]
        assert opt == best["optimizers.trunk_optimizer.lr"]
        assert bins == best["loss_funcs.metric_loss.num_bins"]
        assert run["seed"] == seed  # the folder is named after the seed it holds
        assert "tune" not in run
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["tuned_from"] == str(tmp_path / "t")
    assert summary["tuned_params"] == {"plugin FastAP": best}


def test_a_bad_space_exits_2_naming_the_key(tmp_path, capsys):
    cfg = glyph_config()
    cfg["tune"]["space"] = {"optimizers.trunk_optimizer.lr": {"float": [1.0, 0.1]}}
    path = write(tmp_path / "c.yaml", cfg)
    assert main(["tune", path, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "tune.space.optimizers.trunk_optimizer.lr" in err and "low 1.0 > high 0.1" in err
    assert not (tmp_path / "t").exists()


def test_compare_tuned_without_a_tune_folder_exits_2(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", glyph_config())
    assert main(["compare", path, "--tuned", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert "no tune.json" in capsys.readouterr().err


def test_markdown_counts_every_state():
    summary = {
        "storage": "sqlite:///x",
        "methods": {
            "m": {
                "best_value": 0.5,
                "best_trial": 2,
                "n_trials": 4,
                "states": {"complete": 2, "pruned": 1, "fail": 1},
                "wall_seconds": 3.0,
                "best_params": {"a.b": 0.001},
            }
        },
    }
    row = next(line for line in markdown(summary, "precision_at_1").splitlines() if "| m |" in line)
    assert row == "| m | 50.00 | 2 | 4 | 2 | 1 | 1 | 0 | - | `a.b`=0.001 |"
    # an interrupted trial is FAIL in the study but shown apart, outside "trials"
    summary["methods"]["m"].update(n_interrupted=1, states={"complete": 2, "pruned": 1, "fail": 2})
    row = next(line for line in markdown(summary, "precision_at_1").splitlines() if "| m |" in line)
    assert row == "| m | 50.00 | 2 | 4 | 2 | 1 | 1 | 1 | - | `a.b`=0.001 |"
    # the study's trial seconds over every call, not this call's wall time (a no-op call: 0.1)
    summary["methods"]["m"].update(wall_seconds=0.1, trial_seconds=4321.4)
    row = next(line for line in markdown(summary, "precision_at_1").splitlines() if "| m |" in line)
    assert row == "| m | 50.00 | 2 | 4 | 2 | 1 | 1 | 1 | 4,321 | `a.b`=0.001 |"


def test_study_summary_sums_the_finished_trials_durations():
    study = optuna.create_study(direction="maximize")
    for value in (0.2, 0.4):
        trial = study.ask()
        study.tell(trial, value)
    study.ask()  # running: no end, adds nothing
    trials = study.get_trials(deepcopy=False)
    for t, seconds in zip(trials, (30, 90, 500)):  # storage times made known
        t.datetime_start = datetime.datetime(2026, 1, 1)
        if t.datetime_complete is not None:
            t.datetime_complete = t.datetime_start + datetime.timedelta(seconds=seconds)
    out = study_summary(study, 0.1, tiny_config())
    assert out["trial_seconds"] == pytest.approx(120.0) and out["wall_seconds"] == 0.1
    # an interrupted trial (killed, marked failed by a later call) is left out
    interrupted = study.ask()
    study.tell(interrupted, state=optuna.trial.TrialState.FAIL)
    study.get_trials(deepcopy=False)[-1].datetime_complete = datetime.datetime(2026, 1, 2)
    assert is_interrupted(study.get_trials(deepcopy=False)[-1])
    assert study_summary(study, 0.1, tiny_config())["trial_seconds"] == pytest.approx(120.0)


def test_history_carries_the_best_over_pruned_and_failed_trials():
    import optuna
    from optuna.trial import TrialState

    from pml_rank_plugins.reporting.tune_report import best_so_far

    study = optuna.create_study(direction="maximize")
    for state, value in [
        (TrialState.FAIL, None),
        (TrialState.COMPLETE, 0.3),
        (TrialState.PRUNED, None),
        (TrialState.COMPLETE, 0.2),
        (TrialState.COMPLETE, 0.5),
    ]:
        trial = study.ask()
        study.tell(trial, value, state=state)
    assert best_so_far(study) == ([1, 2, 3, 4], [0.3, 0.3, 0.3, 0.5])


def test_trials_or_jobs_below_one_exit_2(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", glyph_config())
    for flag in ("--trials", "--jobs"):
        assert main(["tune", path, "--out", str(tmp_path / "t"), flag, "0"]) == 2
        assert f"{flag} must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def run_config_epochs(run_dir) -> int:
    return load_yaml(run_dir / "config.yaml")["trainer"]["MetricLossOnly"]["num_epochs"]


@pytest.mark.slow
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")  # as in the test above
def test_compare_tuned_trains_the_budget_it_was_tuned_at(tmp_path, capsys):
    # The reproduction: tuned with --set trainer.num_epochs=N, compared without it.
    cfg = glyph_config(epochs=2)
    cfg["methods"].pop("PML Contrastive")
    path = write(tmp_path / "c.yaml", cfg)
    tune_out = str(tmp_path / "t")
    one_epoch = ["--set", "trainer.num_epochs=1"]
    assert main(["tune", path, "--out", tune_out, "--trials", "1"] + one_epoch) == 0
    entry = json.loads((tmp_path / "t" / "tune.json").read_text())["methods"]["plugin FastAP"]
    assert entry["config"]["trainer"]["MetricLossOnly"]["num_epochs"] == 1
    assert entry["config_hash"].startswith("sha256:") and "data_root" in entry
    capsys.readouterr()

    # no retrieval pictures: what is under test is the budget each run trained at
    compare = ["compare", path, "--tuned", tune_out, "--seeds", "1", "--no-pictures"]
    assert main(compare + ["--out", str(tmp_path / "c0")]) == 0
    assert run_config_epochs(tmp_path / "c0" / "plugin_FastAP" / "seed1") == 1  # not the file's 2
    capsys.readouterr()

    assert main(compare + ["--out", str(tmp_path / "c1"), "--set", "trainer.num_epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "trainer.MetricLossOnly.num_epochs" in err and "tuned value 1" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c1").exists()

    assert main(compare + ["--out", str(tmp_path / "c2")] + one_epoch) == 0  # the tuning's own

    allow = ["--out", str(tmp_path / "c3"), "--set", "trainer.num_epochs=2"]
    assert main(compare + allow + ["--allow-budget-change"]) == 0
    assert run_config_epochs(tmp_path / "c3" / "plugin_FastAP" / "seed1") == 2
    summary = json.loads((tmp_path / "c3" / "summary.json").read_text())
    change = summary["budget_changes"]["plugin FastAP"][0]
    assert (change["key"], change["tuned"], change["used"]) == (
        "trainer.MetricLossOnly.num_epochs",
        1,
        2,
    )
    assert summary["tuned_config_hash"] == {"plugin FastAP": entry["config_hash"]}

    # continuing the study at another budget is refused, naming the key
    assert main(["tune", path, "--out", tune_out, "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert "tuned with another config" in err and "trainer.MetricLossOnly.num_epochs" in err


def test_allow_budget_change_without_tuned_exits_2(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", glyph_config())
    assert main(["compare", path, "--allow-budget-change", "--out", str(tmp_path / "c")]) == 2
    assert "only with --tuned" in capsys.readouterr().err


def test_compare_tuned_with_an_old_tune_json_exits_2_with_the_fix(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", glyph_config())
    old = {"methods": {"plugin FastAP": {"best_params": {}, "seed": 0}}}
    (tmp_path / "tune.json").write_text(json.dumps(old))
    assert main(["compare", path, "--tuned", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "no recorded config" in err and "tune again" in err


def test_in_memory_storage_is_refused_before_any_trial(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", glyph_config())
    args = ["tune", path, "--out", str(tmp_path / "t"), "--storage", "sqlite:///:memory:"]
    assert main(args) == 2
    assert "in-memory SQLite" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
