"""``trainer.compile`` / ``--compile``: a compiled run equals the eager one and reports its
compile time (``running/compiled.py``, ``experiment/compiling.py``)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from pml_rank_plugins import cli
from pml_rank_plugins.cli_args import build_parser
from pml_rank_plugins.commands.options import COMPILE_OVERRIDE, compile_overrides
from pml_rank_plugins.experiment import ConfigError, build_experiment
from pml_rank_plugins.experiment.compiling import CompileSettings
from pml_rank_plugins.experiment.schema import dump_yaml, load_yaml
from pml_rank_plugins.experiment.tuned import change_allowed
from pml_rank_plugins.running import compiled as compiled_module
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.checkpoints import load_checkpoint
from pml_rank_plugins.running.compiled import compile_experiment
from pml_rank_plugins.running.resume import check_resume_config
from tests.tiny import tiny_config

AOT = {"backend": "aot_eager"}  # traces like inductor (Dynamo + AOT autograd), compiles no C++


def one_epoch(loss: dict, compile_value=None) -> dict:
    """The tiny config, 1 epoch x 3 iterations, with ``loss`` (and ``trainer.compile``)."""
    trainer = {"num_epochs": 1}
    if compile_value is not None:
        trainer["compile"] = compile_value
    cfg = tiny_config(trainer={"MetricLossOnly": trainer})
    cfg["loss_funcs"] = {"metric_loss": loss}
    return cfg


def weights(run_dir) -> dict[str, torch.Tensor]:
    models = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["models"]
    return {f"{m}.{k}": v for m, sd in models.items() for k, v in sd.items()}


# FastAP on the sync-free ``gpu`` backend; RankedList on the default backend (``cpu`` for CPU
# tensors), which compiled to wrong values before issue 48's fix of the ``cpu`` backend (item 1:
# this case then fails, trunk.fc.weight differs); PML's own loss as the reference case.
LOSSES = {
    "plugin_fastap_gpu": {"plugin:FastAPLoss": {"backend": "gpu"}},
    "plugin_ranked_list_default": {"plugin:RankedListLoss": {}},
    "pml_contrastive": {"ContrastiveLoss": {}},
}


@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
def test_a_compiled_run_equals_the_eager_run_and_reports_its_compile_time(tmp_path, loss, caplog):
    torch._dynamo.reset()
    eager = runner.train(one_epoch(loss), tmp_path / "eager")
    with caplog.at_level(logging.INFO, logger="pml_rank_plugins.running"):
        compiled = runner.train(one_epoch(loss, AOT), tmp_path / "compiled")
    a, b = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    assert a.keys() == b.keys()  # nn.Module.compile: no _orig_mod. prefix in the checkpoints
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    assert compiled["history"][0]["train_loss"] == pytest.approx(
        eager["history"][0]["train_loss"], rel=1e-5
    )
    assert compiled["test"]["test"] == pytest.approx(eager["test"]["test"], abs=1e-6)
    record = json.loads((tmp_path / "compiled" / "metrics.json").read_text())["compile"]
    assert record["backend"] == "aot_eager" and record["fullgraph"] is False
    assert record["compiled"] == ["models.trunk", "models.embedder", "loss_funcs.metric_loss"]
    assert record["seconds"] > 0 and record["graphs"] >= 2  # trunk and loss were traced
    assert "compile" not in json.loads((tmp_path / "eager" / "metrics.json").read_text())
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("torch.compile (backend aot_eager): models.trunk") for line in lines)
    assert any("s compiling this epoch" in line for line in lines), lines


def test_compile_experiment_compiles_in_place_and_leaves_eager_runs_alone():
    exp = build_experiment(one_epoch(LOSSES["pml_contrastive"]))
    assert compile_experiment(exp) == []
    assert exp.models["trunk"]._compiled_call_impl is None
    exp = build_experiment(one_epoch(LOSSES["pml_contrastive"], AOT))
    trunk = exp.models["trunk"]
    assert compile_experiment(exp) == ["models.trunk", "models.embedder", "loss_funcs.metric_loss"]
    assert exp.models["trunk"] is trunk and trunk._compiled_call_impl is not None
    assert exp.loss_funcs["metric_loss"]._compiled_call_impl is not None


def test_the_compile_flag_is_the_first_set(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    dump_yaml(one_epoch(LOSSES["pml_contrastive"]), cfg)
    out = tmp_path / "run"
    # --compile, refined by a later --set: the explicit mapping wins (aot_eager, not inductor)
    argv = ["train", str(cfg), "--out", str(out), "--compile"]
    assert cli.main([*argv, "--set", "trainer.compile={backend: aot_eager}"]) == 0
    saved = load_yaml(out / "config.yaml")["trainer"]["MetricLossOnly"]
    assert saved["compile"] == {"backend": "aot_eager"}
    assert json.loads((out / "metrics.json").read_text())["compile"]["backend"] == "aot_eager"


@pytest.mark.parametrize("command", ["train", "compare", "tune", "study"])
def test_train_compare_tune_and_study_take_compile(command):
    args = build_parser().parse_args([command, "default", "--compile", "--set", "seed=1"])
    assert compile_overrides(args) == [COMPILE_OVERRIDE, "seed=1"]
    args = build_parser().parse_args([command, "default", "--set", "seed=1"])
    assert compile_overrides(args) == ["seed=1"]


def test_a_bad_compile_value_is_refused_before_training_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.MetricLossOnly\.compile\.mode"):
        runner.train(one_epoch(LOSSES["pml_contrastive"], {"mode": "fastest"}), tmp_path / "r")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_compile_may_change_on_resume_and_in_a_tuned_comparison(tmp_path):
    saved = one_epoch(LOSSES["pml_contrastive"])
    for value in (True, AOT):
        check_resume_config(saved, one_epoch(LOSSES["pml_contrastive"], value), tmp_path)
    both = one_epoch(LOSSES["pml_contrastive"], {"backend": "inductor"})
    check_resume_config(both, one_epoch(LOSSES["pml_contrastive"], AOT), tmp_path)
    changed = one_epoch(LOSSES["pml_contrastive"], True)
    changed["seed"] = 3
    with pytest.raises(ConfigError, match="seed"):  # anything else still refused
        check_resume_config(saved, changed, tmp_path)
    assert change_allowed("trainer.MetricLossOnly.compile")
    assert change_allowed("trainer.MetricLossOnly.compile.backend")
    assert not change_allowed("trainer.MetricLossOnly.batch_size")


def test_a_loss_that_is_no_module_is_replaced_by_its_compiled_function():
    def plain_loss(embeddings, labels):
        return (embeddings**2).sum() + labels.sum()

    exp = SimpleNamespace(
        extra={"compile": CompileSettings("eager")},
        models={"trunk": torch.nn.Linear(2, 2)},
        loss_funcs={"metric_loss": plain_loss},
    )
    assert compile_experiment(exp) == ["models.trunk", "loss_funcs.metric_loss"]
    compiled = exp.loss_funcs["metric_loss"]
    assert compiled is not plain_loss
    x, y = torch.ones(3, 2), torch.arange(3)
    assert float(compiled(x, y)) == float(plain_loss(x, y)) == 9.0


def test_without_dynamo_counters_the_time_is_unknown_not_zero(monkeypatch):
    monkeypatch.setattr(compiled_module, "compile_totals", lambda: None)
    meter = compiled_module.CompileMeter(CompileSettings("eager"), ["models.trunk"])
    record = meter.record()
    assert record["seconds"] is None and record["graphs"] is None and record["backend"] == "eager"
    assert meter.new_since_last() is None
    assert compiled_module.CompileMeter(None, []).record() is None  # eager: no record at all
