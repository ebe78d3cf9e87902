"""PML's two repeated warnings (issue 50, item 6): ``optimizers is missing "embedder_optimizer"``
for a model with nothing to train, and torch's ``requires_grad`` UserWarning from PML's progress
bar, are not shown; PML's warning for a model *with* parameters and no optimizer still is."""

from __future__ import annotations

import logging
import warnings

from pml_rank_plugins.experiment import builder
from tests.tiny import tiny_config

MISSING = 'optimizers is missing "{}_optimizer"'


def _pml_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "PML"]


def test_no_missing_optimizer_line_for_a_parameterless_embedder(caplog):
    config = tiny_config(models={"embedder": {"Identity": {}}})
    exp = builder.build_experiment(config, "cpu")
    assert sorted(exp.models) == ["embedder", "trunk"]
    with caplog.at_level(logging.WARNING, logger="PML"):
        builder.make_trainer(exp)
    assert MISSING.format("embedder") not in _pml_lines(caplog)


def test_a_model_with_parameters_and_no_optimizer_still_warns(caplog):
    config = tiny_config(models={"embedder": {"Linear": {"in_features": 16, "out_features": 8}}})
    exp = builder.build_experiment(config, "cpu")
    with caplog.at_level(logging.WARNING, logger="PML"):
        builder.make_trainer(exp)
    assert MISSING.format("embedder") in _pml_lines(caplog)
    # the filter is removed after the trainer is built: PML's logger is left as it was
    assert not builder.pml_common.LOGGER.filters


def _shown(module: str) -> bool:
    """Whether the torch warning PML's progress bar raises (as torch raises it: attributed to
    the Python line that converted the tensor) passes the current filters, for ``module``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit(
            "Converting a tensor with requires_grad=True to a scalar may lead to unexpected "
            "behavior.",
            UserWarning,
            "base_trainer.py",
            89,
            module=module,
            registry={},
        )
    return bool(caught)


def test_pml_progress_bar_requires_grad_warning_is_not_shown():
    config = tiny_config(
        trainer={"MetricLossOnly": {"batch_size": 12, "iterations_per_epoch": 2, "num_epochs": 1}}
    )
    exp = builder.build_experiment(config, "cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning recorded: nothing hidden by "once"
        trainer = builder.make_trainer(exp)  # installs the filter, in front of "always"
        # torch raises this warning once per process (TORCH_WARN_ONCE): an earlier training in
        # the same process may have used it up, so the filter itself is checked below
        trainer.train(1, 1)
        assert not _shown("pytorch_metric_learning.trainers.base_trainer")
        assert _shown("my_training_loop")  # that narrow: the same warning elsewhere still shows
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "requires_grad=True to a scalar" in m], messages
