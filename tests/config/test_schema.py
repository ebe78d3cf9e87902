"""Config loading, merging, --set overrides, method expansion, round trip and validation."""

from __future__ import annotations

import copy

import pytest

from pml_rank_plugins.config.registry import UnknownNameError
from pml_rank_plugins.config.schema import (
    ConfigError,
    apply_set,
    deep_merge,
    dump_yaml,
    expand_methods,
    is_object_spec,
    load_config,
    load_yaml,
    parse_set,
    validate,
)
from tests.config.standins import tiny_config


def test_is_object_spec():
    assert is_object_spec({"ContrastiveLoss": {}})
    assert is_object_spec({"ContrastiveLoss": None})
    assert is_object_spec({"plugin:FastAPLoss": {"num_bins": 5}})
    assert is_object_spec({"torch.optim.Adam": {"lr": 1}})
    assert not is_object_spec({"metric_loss": {"ContrastiveLoss": {}}})
    assert not is_object_spec({"A": {}, "B": {}})
    assert not is_object_spec({"A": 3})


def test_deep_merge_replaces_specs_of_other_classes_and_deletes_on_none():
    base = {
        "loss_funcs": {"metric_loss": {"ContrastiveLoss": {"pos_margin": 0.1}}},
        "mining_funcs": {"tuple_miner": {"MultiSimilarityMiner": {}}},
        "trainer": {"MetricLossOnly": {"batch_size": 8, "num_epochs": 2}},
    }
    over = {
        "loss_funcs": {"metric_loss": {"TripletMarginLoss": {"margin": 0.2}}},
        "mining_funcs": {"tuple_miner": None},
        "trainer": {"MetricLossOnly": {"num_epochs": 5}},
    }
    out = deep_merge(base, over)
    assert out["loss_funcs"]["metric_loss"] == {"TripletMarginLoss": {"margin": 0.2}}
    assert out["mining_funcs"] == {}
    assert out["trainer"] == {"MetricLossOnly": {"batch_size": 8, "num_epochs": 5}}
    assert base["trainer"]["MetricLossOnly"]["num_epochs"] == 2  # inputs untouched


def test_set_overrides_descend_into_specs():
    cfg = tiny_config()
    for path, value in parse_set(
        [
            "trainer.num_epochs=7",
            "eval.recall_at_k=[1, 10]",
            "seed=3",
            "trainer.MetricLossOnly.batch_size=6",
        ]
    ):
        apply_set(cfg, path, value)
    assert cfg["trainer"]["MetricLossOnly"]["num_epochs"] == 7
    assert cfg["trainer"]["MetricLossOnly"]["batch_size"] == 6
    assert cfg["eval"]["recall_at_k"] == [1, 10]
    assert cfg["seed"] == 3
    with pytest.raises(ConfigError):
        parse_set(["no_equals_sign"])


def test_methods_expand_over_base():
    cfg = tiny_config()
    cfg["methods"] = {
        "contrastive": None,
        "triplet": {
            "loss_funcs": {"metric_loss": {"TripletMarginLoss": {"margin": 0.1}}},
            "mining_funcs": {"tuple_miner": {"TripletMarginMiner": {"margin": 0.1}}},
        },
    }
    out = expand_methods(cfg)
    assert list(out) == ["contrastive", "triplet"]
    assert out["contrastive"]["loss_funcs"] == cfg["loss_funcs"]
    assert "TripletMarginLoss" in out["triplet"]["loss_funcs"]["metric_loss"]
    for name, c in out.items():
        assert c["name"] == name and "methods" not in c
        assert c["models"] == cfg["models"] and c["sampler"] == cfg["sampler"]


def test_round_trip(tmp_path):
    cfg = tiny_config()
    cfg["methods"] = {"a": None, "b": {"seed": 4}}
    path = tmp_path / "exp.yaml"
    dump_yaml(cfg, path)
    assert load_yaml(path) == cfg
    loaded = load_config(path, ["trainer.num_epochs=1"])
    assert loaded["b"]["seed"] == 4
    again = tmp_path / "b.yaml"
    dump_yaml(loaded["b"], again)
    assert load_config(again) == {"b": loaded["b"]}


def test_validation_errors():
    validate(tiny_config())
    cfg = tiny_config()
    cfg["optimiser"] = {}
    with pytest.raises(ConfigError, match="optimiser"):
        validate(cfg)
    cfg = tiny_config(loss_funcs={"metric_loss": {"ContrastivLoss": {}}})
    with pytest.raises(UnknownNameError, match="ContrastiveLoss"):
        validate(cfg)
    cfg = tiny_config(
        loss_funcs={
            "metric_loss": {"ContrastiveLoss": {"distance": {"CosineSimilarity": {"pp": 3}}}}
        }
    )
    with pytest.raises(TypeError, match=r"CosineSimilarity\("):
        validate(cfg)
    cfg = tiny_config(
        loss_funcs={"metric_loss": {"ContrastiveLoss": {"distance": {"CosineSimilarty": {}}}}}
    )
    with pytest.raises(UnknownNameError, match="CosineSimilarity"):
        validate(cfg)
    cfg = tiny_config(trainer={"MetricLossOnly": {"batchsize": 4}})
    with pytest.raises(TypeError, match="did you mean batch_size"):
        validate(cfg)
    cfg = copy.deepcopy(tiny_config())
    del cfg["models"]
    with pytest.raises(ConfigError, match="models"):
        validate(cfg)
    cfg = tiny_config(eval={"pattience": 3})
    with pytest.raises(ConfigError, match="pattience"):
        validate(cfg)
