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


def replaying_check():
    """A NonFiniteCheck watching a gpu-backend FastAP loss (value checks off), and that loss."""
    from pml_rank_plugins.losses import FastAPLoss

    loss_func = FastAPLoss(num_bins=5, backend="gpu")
    hook = NonFiniteCheck()
    hook.watch_losses({"metric_loss": loss_func}, None)
    return hook, loss_func


def trainer_with(loss):
    trainer = fake_trainer()
    trainer.losses = {"metric_loss": loss.detach(), "total_loss": loss.detach()}
    return trainer


def test_a_nan_loss_on_gpu_is_replayed_with_value_checks_and_names_the_cause():
    hook, loss_func = replaying_check()
    emb, labels = torch.randn(8, 4), torch.arange(8) % 2
    emb[2, 1] = float("nan")
    loss = loss_func(emb, labels)  # no error on gpu without check_values: a NaN loss
    with pytest.raises(NonFiniteError) as caught:
        hook(trainer_with(loss))
    message = str(caught.value)
    assert message.startswith("non-finite loss at epoch 3, iteration 5 of 10: metric_loss=nan")
    assert (
        "Cause (the batch replayed with check_values=True): FastAPLoss: embeddings contains 1 "
        "non-finite value(s) (NaN or inf), the first embeddings[2, 1] = nan" in message
    )
    assert loss_func.check_values is None  # restored after the replay


def test_an_out_of_range_index_is_named_by_the_replay():
    hook, loss_func = replaying_check()
    emb, labels = torch.randn(8, 4), torch.arange(8) % 2
    pairs = tuple(torch.tensor([i]) for i in (0, 2, 0, 40))
    loss = loss_func(emb, labels, pairs)  # clamped on the device, the loss flagged NaN
    with pytest.raises(NonFiniteError, match=r"indices_tuple\[3\] \(negatives\) has index 40"):
        hook(trainer_with(loss))


def test_valid_inputs_keep_the_plain_message_and_the_latest_call_is_replayed():
    hook, loss_func = replaying_check()
    bad = torch.randn(8, 4)
    bad[0, 0] = float("inf")
    loss_func(bad, torch.arange(8) % 2)
    loss_func(torch.randn(8, 4), torch.arange(8) % 2)  # the latest call: valid inputs
    with pytest.raises(NonFiniteError) as caught:
        hook(trainer_with(torch.tensor(float("nan"))))
    assert "Cause" not in str(caught.value)
    hook(trainer_with(torch.tensor(1.0)))  # finite: nothing replayed, nothing raised


def test_a_training_run_on_the_gpu_backend_names_the_non_finite_embeddings(tmp_path):
    loss = {"pml_rank_plugins.FastAPLoss": {"backend": "gpu"}}
    with pytest.raises(
        NonFiniteError,
        match=r"non-finite loss at epoch 1, .*Cause \(the batch replayed with check_values=True\)"
        r": FastAPLoss: embeddings contains \d+ non-finite value",
    ):
        runner.train(diverging(loss), tmp_path / "run")
