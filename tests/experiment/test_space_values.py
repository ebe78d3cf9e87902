"""Search spaces checked value by value before any trial (third audit, item 7)."""

from __future__ import annotations

import pytest

from pml_rank_plugins.experiment import builder
from pml_rank_plugins.experiment.methods import collect_methods
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.experiment.search_space import Param, check_tune_config
from pml_rank_plugins.experiment.space_values import check_space_values, probe_values
from tests.running.test_tune import glyph_config

FASTAP = "plugin FastAP"


def fastap(space=None, **tune) -> dict:
    cfg = glyph_config()
    if space is not None:
        cfg["methods"][FASTAP]["tune"] = {"space": space}
    cfg["tune"].update(tune)
    return collect_methods([cfg], methods=[FASTAP])[FASTAP]


def test_probe_values_are_the_bounds_the_middle_and_every_choice():
    assert probe_values(Param("a", "int", 5, 20)) == [5, 12, 20]
    assert probe_values(Param("a", "float", 0.0, 1.0)) == [0.0, 0.5, 1.0]
    assert probe_values(Param("a", "int", 3, 3)) == [3]
    assert probe_values(Param("a", "choice", choices=(1, "x"))) == [1, "x"]


def test_the_shipped_kind_of_space_passes():
    check_space_values(fastap(), FASTAP)


@pytest.mark.parametrize(
    "space, key, value",
    [
        ({"loss_funcs.metric_loss.num_bins": {"int": [0, 0]}}, "num_bins", "0"),
        ({"optimizers.trunk_optimizer.lr": {"float": [-1.0, -0.5]}}, "lr", "-1.0"),
        ({"trainer.batch_size": {"choice": ["64"]}}, "trainer.batch_size", "'64'"),
        ({"loss_funcs.metric_loss": {"choice": ["subprocess.run"]}}, "metric_loss", "subprocess"),
        ({"loss_funcs.metric_loss.num_bins": {"choice": [10, -3]}}, "num_bins", "-3"),
    ],
)
def test_a_space_value_the_class_refuses_is_a_config_error(space, key, value):
    cfg = fastap({**space})
    cfg["tune"]["space"] = space  # this method's space only
    with pytest.raises(ConfigError) as e:
        check_space_values(cfg, FASTAP)
    msg = str(e.value)
    assert f"method {FASTAP!r}" in msg and key in msg and value in msg and "refused" in msg


@pytest.mark.parametrize(
    "key", ["split.class_disjoint_split.seed", "dataset.GlyphDataset.seed", "eval.patience"]
)
def test_split_dataset_and_eval_keys_cannot_be_tuned(key):
    cfg = fastap()
    cfg["tune"]["space"] = {key: {"int": [0, 100]}}
    with pytest.raises(ConfigError, match="cannot be tuned"):
        check_tune_config(cfg, FASTAP)


@pytest.mark.parametrize(
    "sampler",
    [
        {"__class__": {}},
        {"BaseSampler": {}},
        {"PartialFixedSampler": {"fixed_params": {}, "base_sampler": None}},
        {"TPESampler": [1, 2]},
    ],
)
def test_sampler_values_tune_cannot_use_are_refused(sampler):
    cfg = fastap(sampler=sampler)
    with pytest.raises(ConfigError, match="tune.sampler"):
        check_tune_config(cfg, FASTAP)


def test_models_are_built_once_unless_the_value_changes_them(monkeypatch):
    built = []
    real = builder.build_models
    monkeypatch.setattr(builder, "build_models", lambda cfg, dev: built.append(1) or real(cfg, dev))
    # the shipped space: lr (3 probes) and num_bins (3 probes), none under models.
    check_space_values(fastap(), FASTAP)
    assert len(built) == 1
    built.clear()
    # embedding_dim 4, 5, 6 (the config has 8): three builds; lr's probes share a fourth
    check_space_values(fastap({"models.trunk.ConvEmbedder.embedding_dim": {"int": [4, 6]}}), FASTAP)
    assert len(built) == 3 + 1
