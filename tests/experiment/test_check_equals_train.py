"""C1-C5 (issue 20): `pml-rank check` refuses what `pml-rank train` would fail on, naming the key.

C1 integer sizes and counts (one integer validator); C2 eval settings and split names; C3 device,
learning rates, PML keywords PML does not validate, loss ranges; C4 bounded YAML (alias bomb,
nesting depth) and file/line in YAML/UTF-8 errors; C5 every exit-2 message names the key.
"""

from __future__ import annotations

import time

import pytest
import yaml

from pml_rank_plugins import cli
from pml_rank_plugins.experiment import builder
from pml_rank_plugins.experiment.revisited import revisited_entries
from pml_rank_plugins.experiment.schema import ConfigError, apply_set
from pml_rank_plugins.running import train
from tests.tiny import tiny_config

T = "trainer.MetricLossOnly"
TESTER = "eval.tester.GlobalEmbeddingSpaceTester"


def _check(tmp_path, capsys, key: str, value) -> str:
    """`pml-rank check` of the tiny config with ``key`` set to ``value``: exit 2; stderr."""
    cfg = tiny_config()
    apply_set(cfg, key.split("."), value)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check", str(path)]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "key, value",
    [
        (f"{T}.batch_size", 2.5),
        (f"{T}.batch_size", "64"),
        (f"{T}.batch_size", True),
        (f"{T}.iterations_per_epoch", -1),
        (f"{T}.iterations_per_epoch", 1.5),
        (f"{T}.iterations_per_epoch", 1e15),
        (f"{T}.num_epochs", 2.5),
        ("seed", 1.5),
        (f"{TESTER}.batch_size", 0),
    ],
)
def test_C1_integer_sizes_and_counts(tmp_path, capsys, key, value):
    err = _check(tmp_path, capsys, key, value)
    assert f"config error: {key} must be an integer" in err


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("eval.test_interval", 0, "eval.test_interval must be an integer"),
        ("eval.patience", -1, "eval.patience must be an integer in [0,"),
        ("eval.validation", ["abc"], "eval.validation[0]: split 'abc' does not exist"),
        ("eval.test", ["nosplit"], "eval.test[0]: split 'nosplit' does not exist"),
        ("eval.test", {"a": 1}, "eval.test: expected a list"),
        ("eval.validation", [{"query": {"a": 1}}], "eval.validation[0]: expected a split name"),
    ],
)
def test_C2_eval_settings_and_split_names(tmp_path, capsys, key, value, shown):
    assert shown in _check(tmp_path, capsys, key, value)


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("device", "tpu", "device: unknown device 'tpu'"),
        ("optimizers.trunk_optimizer.Adam.lr", float("inf"), "trunk_optimizer.Adam.lr: must be"),
        (f"{T}.dataloader_num_workers", -1, f"{T}.dataloader_num_workers must be an integer"),
        (
            "loss_funcs.metric_loss",
            {"plugin:FastAPLoss": {"num_bins": 1e9}},
            "loss_funcs.metric_loss.plugin:FastAPLoss.num_bins: expected int, got float",
        ),
    ],
)
def test_C3_device_rates_and_unvalidated_keywords(tmp_path, capsys, key, value, shown):
    assert shown in _check(tmp_path, capsys, key, value)


def _alias_bomb() -> str:
    """Nine levels of nine aliases: 9**9 values from a few hundred bytes."""
    names = "abcdefghi"
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("dataset: {TinyDataset: {junk: {%s}}}" % _alias_bomb().replace("\n", ", "), "expands"),
        ("models: " + "[" * 5000 + "]" * 5000, "line 1, column "),
        ("a: &a [*a]", "recursive"),
        ("models: {trunk: [1, 2\n", "line 2"),
        ("seed: 1\nname: \x00\n", "line 2"),
        ("? {a: 1}\n: 2\n", "line 1, column 3: invalid YAML"),
    ],
)
def test_C4_yaml_bounds_and_errors_name_the_file(tmp_path, capsys, text, shown):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    start = time.perf_counter()
    assert cli.main(["check", str(path)]) == 2
    assert time.perf_counter() - start < 5  # fails fast, no hang
    err = capsys.readouterr().err
    assert f"config error: {path}: " in err and shown in err


def test_C4_not_utf8_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"seed: 0\nname: caf\xe9\n")
    assert cli.main(["check", str(path)]) == 2
    assert f"{path}: line 2: not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize(
    "key, value",
    [
        ("eval.recall_at_k", [{"a": 1}]),
        ("eval.metrics", [{"a": 1}]),
        ("eval.primary_metric", {"a": 1}),
        ("name", {"a": 1}),
        ("split.names", [{"a": 1}, "val", "test"]),
        ("seed", {"a": 1}),
        ("device", {"a": 1}),
        ("eval.k", {"a": 1}),
    ],
)
def test_C5_every_exit_2_message_names_the_key(tmp_path, capsys, key, value):
    err = _check(tmp_path, capsys, key, value)
    assert "unhashable" not in err and f"config error: {key}" in err


@pytest.mark.parametrize(
    "key, value",
    [("eval.test_interval", 0), ("eval.test", ["nosplit"]), (f"{T}.num_epochs", 2.5)],
)
def test_C1_C2_what_check_refuses_train_refuses_before_training(tmp_path, key, value):
    """Before the fix `train` failed on these after training (ZeroDivisionError at
    test_interval 0, exit 2 after training for a missing test split) or ran 2 of 2.5 epochs;
    now the same ConfigError, and no run folder content is written."""
    cfg = tiny_config()
    apply_set(cfg, key.split("."), value)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[")):
        builder.build_experiment(cfg)
    with pytest.raises(ConfigError, match=key.split("[")[0].replace(".", r"\.")):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize(
    "entry, shown",
    [
        ({"ks": [1.5]}, "eval.revisited[0].ks[0] must be an integer"),
        ({"ks": 5}, "eval.revisited[0].ks: expected a non-empty list"),
        ({"batch_size": 0}, "eval.revisited[0].batch_size must be an integer"),
    ],
)
def test_C1_revisited_ks_and_batch_size(entry, shown):
    cfg = {"eval": {"revisited": [{"dataset": {"RevisitedOxfordParis": {}}, **entry}]}}
    with pytest.raises(ConfigError) as info:
        revisited_entries(cfg)
    assert shown in str(info.value)
