"""Config loading, merging, --set overrides, method expansion, round trip and validation."""

from __future__ import annotations

import copy

import pytest

from pml_rank_plugins.experiment.registry import UnknownNameError
from pml_rank_plugins.experiment.schema import (
    ConfigError,
    apply_set,
    deep_merge,
    dump_yaml,
    equivalence_margin,
    expand_methods,
    is_object_spec,
    load_config,
    load_yaml,
    parse_set,
    validate,
)
from tests.tiny import tiny_config


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


def test_exponent_floats_are_floats(tmp_path):
    """YAML 1.1 (PyYAML) reads ``1e-3`` as a string; configs and --set read it as a float."""
    path = tmp_path / "c.yaml"
    path.write_text("a: 1e-3\nb: 1.0e+38\nc: -2E4\nd: '1e-3'\ne: 3\nf: 0.5\n")
    data = load_yaml(path)
    assert data == {"a": 1e-3, "b": 1e38, "c": -2e4, "d": "1e-3", "e": 3, "f": 0.5}
    assert all(type(data[k]) is float for k in "abcf") and type(data["e"]) is int
    assert parse_set(["optimizers.trunk_optimizer.Adam.lr=1e-4"]) == [
        (["optimizers", "trunk_optimizer", "Adam", "lr"], 1e-4)
    ]
    assert parse_set(["x={SGD: {lr: 1e-2}}"])[0][1] == {"SGD": {"lr": 0.01}}


def test_lr_written_1e_3_trains(tmp_path):
    from pml_rank_plugins.experiment import builder

    path = tmp_path / "c.yaml"
    cfg = tiny_config()
    cfg["optimizers"] = {"trunk_optimizer": {"Adam": {"lr": "LR"}}}
    path.write_text(dump_yaml(cfg).replace("LR", "1e-3"))
    (loaded,) = load_config(path).values()
    exp = builder.build_experiment(loaded)
    assert exp.optimizers["trunk_optimizer"].param_groups[0]["lr"] == 1e-3


@pytest.mark.parametrize(
    "where, spec, pattern",
    [
        ("optimizers", {"trunk_optimizer": {"Adam": {"lr": "fast"}}}, r"optimizers\.trunk_optimizer\.Adam\.lr: expected float"),
        ("optimizers", {"trunk_optimizer": {"Adam": {"lr": -1.0}}}, r"optimizers\.trunk_optimizer: Adam: Invalid learning rate"),
        ("lr_schedulers", {"trunk_scheduler_by_epoch": {"StepLR": {"step_size": 1, "last_epoch": 5}}}, r"lr_schedulers\.trunk_scheduler_by_epoch: StepLR: KeyError: .*initial_lr"),
        ("dataset", {"TinyDataset": {"num_classes": -3}}, r"dataset: TinyDataset: "),
        ("split", {"class_disjoint_split": {"fractions": [0.9, 0.9]}, "names": ["train", "val"]}, r"split: class_disjoint_split: fractions must sum to 1"),
    ],
)  # fmt: skip
def test_build_errors_name_the_config_key(where, spec, pattern):
    from pml_rank_plugins.experiment import builder

    cfg = tiny_config()
    cfg[where] = spec
    with pytest.raises((ValueError, TypeError), match=pattern):
        builder.build_experiment(cfg)


def test_pml_cross_batch_memory_with_our_loss_points_to_ours():
    from pml_rank_plugins.experiment import builder

    memory = {"loss": {"pml_rank_plugins.FastAPLoss": {}}, "embedding_size": 16}
    cfg = tiny_config(loss_funcs={"metric_loss": {"CrossBatchMemory": memory}})
    with pytest.raises(ConfigError, match="write pml_rank_plugins.CrossBatchMemory instead"):
        validate(cfg)
    # Building without validation: PML's bare Exception becomes a ConfigError naming the key.
    with pytest.raises(ConfigError, match=r"loss_funcs\.metric_loss: CrossBatchMemory: Exception"):
        builder.build_object(cfg["loss_funcs"]["metric_loss"], "loss_funcs.metric_loss")
    cfg["loss_funcs"]["metric_loss"] = {"pml_rank_plugins.CrossBatchMemory": memory}
    validate(cfg)
    assert type(builder.build_object(cfg["loss_funcs"]["metric_loss"], "m")).__module__.startswith(
        "pml_rank_plugins"
    )


def test_compare_section_declares_the_equivalence_margin(tmp_path):
    assert equivalence_margin(tiny_config()) is None  # no section: no equivalence test
    cfg = validate(tiny_config(compare={"equivalence_margin": 1.0}))
    assert equivalence_margin(cfg) == 1.0
    assert equivalence_margin(tiny_config(compare={"equivalence_margin": 2})) == 2.0  # int points
    assert equivalence_margin(tiny_config(compare={"equivalence_margin": None})) is None
    # From the command line (--set values are YAML) and from a file, for every method.
    path = tmp_path / "c.yaml"
    dump_yaml({**tiny_config(), "methods": {"A": {}, "B": {"seed": 1}}}, path)
    configs = load_config(path, ["compare.equivalence_margin=0.5"])
    assert [equivalence_margin(c) for c in configs.values()] == [0.5, 0.5]


@pytest.mark.parametrize(
    "value", [0, 0.0, -1.0, "1.0", "abc", True, False, float("inf"), float("nan"), [1.0]]
)
def test_equivalence_margin_must_be_a_positive_finite_number(value):
    with pytest.raises(ConfigError, match=r"compare\.equivalence_margin: expected a positive"):
        validate(tiny_config(compare={"equivalence_margin": value}))


def test_compare_section_shape_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"compare: unknown key\(s\) \['equivalence'\]"):
        validate(tiny_config(compare={"equivalence": 1.0}))
    with pytest.raises(ConfigError, match="compare: expected a mapping"):
        validate(tiny_config(compare=1.0))
    path = tmp_path / "c.yaml"
    dump_yaml(tiny_config(), path)
    for bad in ("compare.equivalence_margin=0", "compare.equivalence_margin=.inf"):
        with pytest.raises(ConfigError, match=r"compare\.equivalence_margin"):
            load_config(path, [bad])
