"""``<name>_scheduler_by_plateau`` schedulers are stepped once per validation with the primary
metric: the learning rate a run ends with is what torch's own ``ReduceLROnPlateau`` gives when
fed the run's recorded validation values."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.running import runner
from pml_rank_plugins.running.checkpoints import load_checkpoint
from tests.tiny import tiny_config

LR = 0.01
# An absolute threshold of 1 (a MAP@R is at most 1): only the first validation counts as an
# improvement, so with patience 0 every later one divides the rate by 10.
PLATEAU = {"mode": "max", "factor": 0.1, "patience": 0, "threshold": 1.0, "threshold_mode": "abs"}


def lr_after(values: list[float]) -> float:
    """The learning rate after stepping a fresh ReduceLROnPlateau with ``values`` (the
    reference: torch's class on a dummy parameter, independent of the runner)."""
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **PLATEAU)
    for v in values:
        scheduler.step(v)
    return optimizer.param_groups[0]["lr"]


def test_plateau_scheduler_steps_on_the_validation_primary_metric(tmp_path):
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 4}})
    cfg["optimizers"] = {"trunk_optimizer": {"Adam": {"lr": LR}}}
    cfg["lr_schedulers"] = {"trunk_scheduler_by_plateau": {"ReduceLROnPlateau": dict(PLATEAU)}}
    metrics = runner.train(cfg, tmp_path / "run")
    values = [row["validation"]["val"]["mean_average_precision_at_r"] for row in metrics["history"]]
    assert len(values) == 4
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")
    lr = ckpt["optimizers"]["trunk_optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(lr_after(values), rel=1e-12)
    assert lr == pytest.approx(LR * 0.1**3, rel=1e-12)  # epochs 2, 3 and 4 each reduced it
    assert ckpt["lr_schedulers"]["trunk_scheduler_by_plateau"]["last_epoch"] == 4
