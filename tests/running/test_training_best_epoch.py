"""On a tie of the validation primary metric the earlier epoch stays the best one (as PML's
``HookContainer.is_new_best_accuracy``, which needs a strict improvement): its weights are the ones
tested, and a tie does not restart the patience count."""

from __future__ import annotations

from pml_rank_plugins.running import runner
from tests.tiny import tiny_config


def frozen_config(num_epochs: int, patience=None) -> dict:
    """A run whose model never changes: learning rate 0 and BatchNorm frozen (its running
    statistics are not updated), so every epoch's validation metrics are identical."""
    cfg = tiny_config(
        trainer={"MetricLossOnly": {"num_epochs": num_epochs, "freeze_trunk_batchnorm": True}}
    )
    cfg["optimizers"] = {"trunk_optimizer": {"SGD": {"lr": 0.0}}}
    cfg["eval"]["patience"] = patience
    return cfg


def test_a_tie_keeps_the_earlier_epoch_and_does_not_restart_patience(tmp_path):
    m = runner.train(frozen_config(3), tmp_path / "a")
    values = [row["validation"]["val"]["mean_average_precision_at_r"] for row in m["history"]]
    assert len(values) == 3 and len(set(values)) == 1  # the construction: a three-way tie
    assert m["best"] == {"epoch": 1, "value": values[0]}
    # patience 1: epoch 2 ties (1 epoch without improvement), epoch 3 ties (2 > 1): stop
    stopped = runner.train(frozen_config(5, patience=1), tmp_path / "b")
    assert stopped["stopped_early"] and stopped["epochs_run"] == 3
    assert stopped["best"]["epoch"] == 1
