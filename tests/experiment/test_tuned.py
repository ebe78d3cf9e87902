"""``compare --tuned`` trains the budget a study was tuned at (issue 27 item 1, issue 28 item 6):
:mod:`pml_rank_plugins.experiment.tuned` on hand-made ``tune.json`` contents (no training)."""

from __future__ import annotations

import copy
import json
import logging

import pytest

from pml_rank_plugins.experiment.methods import collect_methods
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.experiment.tuned import (
    budget_config,
    change_allowed,
    config_hash,
    differences,
    load_tuned,
    tuned_configs,
)
from tests.running.test_tune import glyph_config

FASTAP = "plugin FastAP"
BEST = {"optimizers.trunk_optimizer.lr": 0.003, "loss_funcs.metric_loss.num_bins": 7}


def tuned_run(epochs: int = 2, best=None, **entry) -> tuple[dict, dict]:
    """(the config files' methods, a tune.json whose FastAP was tuned at ``epochs``)."""
    configs = collect_methods([glyph_config(epochs=4)], methods=[FASTAP])
    recorded = collect_methods([glyph_config(epochs=epochs)], methods=[FASTAP])[FASTAP]
    config, root = budget_config({**recorded, "data_root": "/data"})
    method = {
        "config": config,
        "config_hash": config_hash(config),
        "data_root": root,
        "best_params": dict(BEST) if best is None else best,
        "seed": 0,
        "direction": "maximize",
        **entry,
    }
    return configs, {"methods": {FASTAP: method}}


def epochs_of(cfg: dict) -> int:
    return cfg["trainer"]["MetricLossOnly"]["num_epochs"]


def test_the_recorded_budget_is_trained_not_the_files():
    configs, tuned = tuned_run(epochs=2)
    out, changes = tuned_configs(tuned, configs)
    cfg = out[FASTAP]
    assert epochs_of(cfg) == 2 and epochs_of(configs[FASTAP]) == 4
    assert cfg["optimizers"]["trunk_optimizer"]["Adam"]["lr"] == 0.003
    assert cfg["loss_funcs"]["metric_loss"]["pml_rank_plugins.FastAPLoss"]["num_bins"] == 7
    assert cfg["seed"] == 1 and cfg["data_root"] == "/data" and "tune" not in cfg
    assert changes == {}


def test_a_budget_changing_set_is_refused_naming_the_key_and_tuned_value():
    configs, tuned = tuned_run(epochs=2)
    with pytest.raises(ConfigError) as e:
        tuned_configs(tuned, configs, ["trainer.num_epochs=4"])
    msg = str(e.value)
    assert "trainer.MetricLossOnly.num_epochs" in msg and "tuned value 2" in msg
    assert "--allow-budget-change" in msg


def test_repeating_the_tunings_own_set_is_no_change():
    configs, tuned = tuned_run(epochs=2)
    out, changes = tuned_configs(tuned, configs, ["trainer.num_epochs=2"])
    assert epochs_of(out[FASTAP]) == 2 and changes == {}


def test_allow_budget_change_runs_and_records_the_change():
    configs, tuned = tuned_run(epochs=2)
    out, changes = tuned_configs(tuned, configs, ["trainer.num_epochs=4"], allow_budget_change=True)
    assert epochs_of(out[FASTAP]) == 4
    assert changes == {
        FASTAP: [
            {
                "key": "trainer.MetricLossOnly.num_epochs",
                "tuned": 2,
                "used": 4,
                "set": "trainer.num_epochs",
            }
        ]
    }


@pytest.mark.parametrize(
    "assignment",
    [
        "seed=5",
        "device=cpu",
        "data_root=/elsewhere",
        "trainer.dataloader_num_workers=2",
        "eval.test=[val]",
        "eval.recall_at_k=[1, 2]",
    ],
)
def test_seed_device_data_root_workers_and_evaluation_only_keys_may_change(assignment):
    configs, tuned = tuned_run()
    out, changes = tuned_configs(tuned, configs, [assignment])
    assert changes == {}
    if assignment == "seed=5":
        assert out[FASTAP]["seed"] == 5  # an explicit seed wins over tuning seed + 1
    if assignment.startswith("data_root"):
        assert out[FASTAP]["data_root"] == "/elsewhere"


@pytest.mark.parametrize(
    "key", ["eval.validation", "eval.patience", "eval.primary_metric", "sampler", "tune.space.x"]
)
def test_keys_that_choose_the_best_epoch_are_budget(key):
    assert not change_allowed(key)


def test_data_root_flag_wins_over_the_recorded_one():
    configs, tuned = tuned_run()
    out, _ = tuned_configs(tuned, configs, data_root="/mnt/data")
    assert out[FASTAP]["data_root"] == "/mnt/data"


@pytest.mark.parametrize(
    "best, words",
    [
        ({**BEST, "eval.test": []}, "'eval.test' is not a key of the method's tune.space"),
        ({**BEST, "dataset.GlyphDataset.seed": 3}, "not a key of the method's tune.space"),
        ({"optimizers.trunk_optimizer.lr": 0.003}, "no value for 'loss_funcs.metric_loss"),
        ({}, "lost its parameters"),
        ({**BEST, "loss_funcs.metric_loss.num_bins": 100}, "outside the tune.space (int [5, 20])"),
        ({**BEST, "loss_funcs.metric_loss.num_bins": True}, "outside the tune.space"),
        ({**BEST, "optimizers.trunk_optimizer.lr": 5.0}, "outside the tune.space (float"),
        ({**BEST, "optimizers.trunk_optimizer.lr": "0.01"}, "outside the tune.space"),
    ],
)
def test_only_keys_and_values_of_the_space_are_applied(best, words):
    configs, tuned = tuned_run(best=best)
    with pytest.raises(ConfigError) as e:
        tuned_configs(tuned, configs)
    assert words in str(e.value)


def test_a_comparison_without_a_test_split_is_refused():
    configs, tuned = tuned_run()
    tuned["methods"][FASTAP]["config"]["eval"]["test"] = []
    with pytest.raises(ConfigError, match="no eval.test split"):
        tuned_configs(tuned, configs)


def test_a_tuned_method_missing_from_the_config_is_refused_unless_methods_chose():
    configs, tuned = tuned_run()
    tuned["methods"]["gone"] = copy.deepcopy(tuned["methods"][FASTAP])
    with pytest.raises(ConfigError, match="'gone' of tune.json is not in the config"):
        tuned_configs(tuned, configs)
    assert list(tuned_configs(tuned, configs, subset=True)[0]) == [FASTAP]


def test_a_config_method_that_was_not_tuned_is_refused():
    configs, tuned = tuned_run()
    tuned["methods"] = {"other": tuned["methods"][FASTAP]}
    with pytest.raises(ConfigError, match="'plugin FastAP' was not tuned"):
        tuned_configs(tuned, configs, subset=True)


def test_a_file_that_drifted_from_the_tuned_config_is_logged(caplog):
    configs, tuned = tuned_run(epochs=2)
    with caplog.at_level(logging.WARNING):
        tuned_configs(tuned, configs)
    assert "differs from the tuned config at trainer.MetricLossOnly.num_epochs" in caplog.text


def test_budget_leaves_out_data_root_and_the_trial_choosers():
    cfg = {"a": 1, "data_root": "/d", "tune": {"trials": 3, "sampler": "X", "space": {"a": 1}}}
    budget, root = budget_config(cfg)
    assert budget == {"a": 1, "tune": {"space": {"a": 1}}} and root == "/d"
    assert config_hash(budget) == config_hash({"tune": {"space": {"a": 1}}, "a": 1})
    assert config_hash(budget) != config_hash({**budget, "a": 2})
    assert differences({"t": {"n": 2}}, {"t": {"n": 4}, "x": 1}) == {"t.n": (2, 4), "x": (None, 1)}


def write_tune_json(tmp_path, content) -> str:
    (tmp_path / "tune.json").write_text(
        content if isinstance(content, str) else json.dumps(content)
    )
    return str(tmp_path)


def test_load_tuned_accepts_a_recorded_tune_json(tmp_path):
    _, tuned = tuned_run()
    assert load_tuned(write_tune_json(tmp_path, tuned)) == tuned


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m.pop("config"), "no recorded config"),
        (lambda m: m["config"].update(seed=9), "does not match its config_hash"),
        (lambda m: m.update(direction="minimize"), "direction"),
        (lambda m: m.update(seed=True), ".seed: expected an integer"),
        (lambda m: m.update(seed=1.7), ".seed: expected an integer"),
        (lambda m: m.update(best_params=[1]), "best_params: expected a mapping"),
    ],
)
def test_load_tuned_refuses_old_or_tampered_entries(tmp_path, edit, words):
    _, tuned = tuned_run()
    edit(tuned["methods"][FASTAP])
    with pytest.raises(ConfigError) as e:
        load_tuned(write_tune_json(tmp_path, tuned))
    assert words in str(e.value) and "tune.json" in str(e.value)


@pytest.mark.parametrize(
    "content", ["{", "[]", '{"methods": 5}', '{"methods": {"m": 3}}', "[" * 100000]
)
def test_load_tuned_refuses_malformed_files_in_one_line(tmp_path, content):
    with pytest.raises(ConfigError, match="tune.json"):
        load_tuned(write_tune_json(tmp_path, content))
