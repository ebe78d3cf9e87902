"""Non-finite training stops with a clear message and a recorded failure (issue 12, item 2)."""

from __future__ import annotations

import json
import types

import pytest
import torch

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.nonfinite import NonFiniteCheck, NonFiniteError, check
from tests.tiny import tiny_config

HUGE_LR = {"SGD": {"lr": 1.0e38}}


def diverging(loss=None) -> dict:
    """The issue's reproduction: a learning rate that blows up the weights, evaluation off."""
    cfg = tiny_config(optimizers={"trunk_optimizer": HUGE_LR})
    cfg["eval"]["validation"], cfg["eval"]["test"] = [], []
    if loss is not None:
        cfg["loss_funcs"]["metric_loss"] = loss
    return cfg


def test_pml_loss_going_nan_stops_the_run_and_is_recorded(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(
        NonFiniteError, match=r"non-finite loss at epoch 1, iteration \d of 3: .*total_loss=nan"
    ):
        runner.train(diverging(), run)
    m = json.loads((run / "metrics.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("NonFiniteError: non-finite loss")
    assert m["failed_in_epoch"] == 1 and m["test"] == {}


def test_cli_exits_1_with_the_message_for_ours_and_pmls(tmp_path, capsys):
    for name, loss in [("pml", None), ("ours", {"pml_rank_plugins.FastAPLoss": {}})]:
        cfg = tmp_path / f"{name}.yaml"
        dump_yaml(diverging(loss), cfg)
        assert main(["train", str(cfg), "--out", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if name == "pml":
            assert "pml-rank: error: non-finite loss at epoch 1" in err
        else:  # our loss refuses the non-finite embeddings: reported with epoch and iteration
            assert "pml-rank: error: non-finite embeddings at epoch 1, iteration" in err
        m = json.loads((tmp_path / name / "metrics.json").read_text())
        assert m["status"] == "failed", name


def test_finished_run_records_status(tmp_path):
    m = runner.train(tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}}), tmp_path / "r")
    assert m["status"] == "finished"


def fake_trainer(loss=1.0, grad=1.0):
    trunk = torch.nn.Linear(2, 2)
    for p in trunk.parameters():
        p.grad = torch.full_like(p, grad)
    return types.SimpleNamespace(
        losses={"metric_loss": torch.tensor(loss), "total_loss": torch.tensor(loss)},
        models={"trunk": trunk, "embedder": torch.nn.Identity()},
        loss_funcs={"metric_loss": torch.nn.Module()},
        epoch=3,
        iteration=4,
        iterations_per_epoch=10,
    )


def test_check_finds_a_nonfinite_gradient_under_finite_losses():
    check(fake_trainer())  # all finite: no error
    with pytest.raises(
        NonFiniteError, match=r"gradient at epoch 3, iteration 5 of 10 in the parameters of trunk"
    ):
        check(fake_trainer(grad=float("inf")))
    with pytest.raises(
        NonFiniteError, match=r"loss at epoch 3, iteration 5 of 10: metric_loss=nan"
    ):
        check(fake_trainer(loss=float("nan")))


def test_hook_chains_and_averages_the_epoch_loss():
    seen = []
    hook = NonFiniteCheck(chained=seen.append)
    assert hook.mean_loss() is None
    for v in (1.0, 2.0, 4.5):
        hook(fake_trainer(loss=v))
    assert hook.mean_loss() == pytest.approx(2.5) and len(seen) == 3
    hook.start_epoch()
    assert hook.mean_loss() is None
    with pytest.raises(NonFiniteError):
        hook(fake_trainer(loss=float("inf")))
    assert len(seen) == 3  # the logging hook never records a non-finite iteration
