"""Mixed precision (``trainer.amp``): models under autocast, losses in float32, float16 scaler."""

from __future__ import annotations

import json

import pytest
import torch
from pytorch_metric_learning.trainers import MetricLossOnly

from pml_rank_plugins.experiment import builder
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.checkpoints import load_checkpoint
from pml_rank_plugins.trainers import DistributedMetricLossOnly, distributed_trainer_class
from pml_rank_plugins.trainers.distributed import make_grad_scaler, parse_amp
from tests.tiny import tiny_config


class RecordingLoss(torch.nn.Module):
    """FastAP that records the dtype of the embeddings it is given."""

    def __init__(self):
        super().__init__()
        self.inner, self.dtypes = FastAPLoss(), []

    def forward(self, embeddings, labels, indices_tuple=None):
        self.dtypes.append(embeddings.dtype)
        return self.inner(embeddings, labels, indices_tuple)


def _one_step(amp):
    torch.manual_seed(0)
    # the dataset on the host, the model on the test device (torch's default device)
    x, y = torch.randn(32, 6, device="cpu"), torch.arange(32, device="cpu") % 4
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    before = [p.detach().clone() for p in model.parameters()]
    trunk_dtypes = []
    model.register_forward_hook(lambda m, i, out: trunk_dtypes.append(out.dtype))
    loss = RecordingLoss()
    trainer = DistributedMetricLossOnly(
        models={"trunk": model},
        optimizers={"trunk_optimizer": torch.optim.SGD(model.parameters(), lr=0.1)},
        batch_size=16,
        loss_funcs={"metric_loss": loss},
        dataset=torch.utils.data.TensorDataset(x, y),
        # not the DataLoader's shuffle: its RandomSampler draws from a CPU generator on the
        # default device, which a CUDA default device refuses (a torch limitation)
        sampler=torch.utils.data.SequentialSampler(range(32)),
        iterations_per_epoch=2,
        dataloader_num_workers=0,
        data_device=torch.get_default_device(),
        amp=amp,
    )
    trainer.train(1, 1)
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters())]
    finite = all(torch.isfinite(p).all() for p in model.parameters())
    return trainer, trunk_dtypes, loss.dtypes, moved, finite


def test_bfloat16_models_autocast_loss_in_float32():  # 0.05 s loaded: not slow
    trainer, trunk, loss, moved, finite = _one_step({"dtype": "bfloat16"})
    assert trunk == [torch.bfloat16, torch.bfloat16]  # the model ran under autocast
    assert loss == [torch.float32, torch.float32]  # the loss got float32 embeddings
    assert trainer.grad_scaler is None  # bfloat16 needs no scaling
    assert all(moved) and finite


def test_float16_uses_a_grad_scaler():
    trainer, trunk, loss, moved, finite = _one_step({"dtype": "float16"})
    assert trunk == [torch.float16, torch.float16] and loss == [torch.float32, torch.float32]
    assert isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    assert trainer.grad_scaler.get_scale() > 0 and finite


def test_no_amp_leaves_float32_untouched():
    _, trunk, loss, moved, _ = _one_step(None)
    assert trunk == [torch.float32] * 2 and loss == [torch.float32] * 2 and all(moved)


@pytest.mark.parametrize(
    "amp, match",
    [
        ({"dtype": "float64"}, "amp.dtype must be one of"),
        ({"dtype": "bfloat16", "scale": 2}, "amp must be"),
        ("bfloat16", "amp must be"),
    ],
)
def test_bad_amp_values_are_named(amp, match):
    with pytest.raises(ValueError, match=match):
        parse_amp(amp)
    cfg = tiny_config(trainer={"MetricLossOnly": {"amp": amp}})
    with pytest.raises(ConfigError, match=f"trainer.MetricLossOnly.{match}"):
        builder.build_experiment(cfg)


def test_grad_scaler_only_for_float16():
    assert make_grad_scaler(None, "cpu") is None
    assert make_grad_scaler({"dtype": "bfloat16"}, "cpu") is None
    assert isinstance(make_grad_scaler({"dtype": "float16"}, "cpu"), torch.amp.GradScaler)


# The runner builds its models and picks its device from the config: on the CPU whatever
# TEST_DEVICE (the kit's training part runs it on a GPU with both autocast dtypes).
@pytest.mark.cpu_only
def test_trainer_class_is_wrapped_only_when_needed():
    assert distributed_trainer_class(MetricLossOnly) is DistributedMetricLossOnly
    exp = builder.build_experiment(tiny_config())
    assert type(builder.make_trainer(exp)) is MetricLossOnly  # single process, no amp: PML's own


@pytest.mark.cpu_only
def test_runner_trains_with_bfloat16_autocast(tmp_path):
    cfg = tiny_config(trainer={"MetricLossOnly": {"amp": {"dtype": "bfloat16"}, "num_epochs": 1}})
    metrics = runner.train(cfg, tmp_path / "run")
    assert metrics["run_info"]["amp"] == {"dtype": "bfloat16"}
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["run_info"]["amp"] == {"dtype": "bfloat16"}
    weights = load_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")["models"]
    initial = builder.build_experiment(cfg).models["trunk"].state_dict()
    assert all(torch.isfinite(v).all() for v in weights["trunk"].values())
    assert not torch.equal(weights["trunk"]["fc.weight"], initial["fc.weight"])
    assert weights["trunk"]["fc.weight"].dtype == torch.float32  # master weights stay float32


@pytest.mark.cpu_only
def test_float16_grad_scaler_state_is_checkpointed_and_resumed(tmp_path):
    cfg = tiny_config(trainer={"MetricLossOnly": {"amp": {"dtype": "float16"}, "num_epochs": 2}})
    runner.train(cfg, tmp_path / "a")
    runner.train(cfg, tmp_path / "b", stop_after_epoch=1)
    runner.train(None, tmp_path / "b", resume=True)
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "latest.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")
    assert a["extra"]["grad_scaler"] == b["extra"]["grad_scaler"]
    assert a["extra"]["grad_scaler"]["scale"] > 0
    for k, v in a["models"]["trunk"].items():
        assert torch.equal(v, b["models"]["trunk"][k]), k
