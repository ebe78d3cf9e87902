"""configs/ablations/*.yaml (docs/ablations.md): every setting validates and builds on Omniglot.

No training: each method is built with the real classes and the real data (the experiment, its
trainer and one batch of its sampler), and each config is checked to be a paired, controlled
ablation (the settings differ from the reference only where the ablation says).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from pml_rank_plugins.experiment import builder
from pml_rank_plugins.experiment.schema import load_config, spec_name_and_kwargs
from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.trainers import ChunkedMetricLossOnly
from tests.data.conftest import shared_dir

REPO = Path(__file__).resolve().parents[2]
ABLATIONS = REPO / "pml_rank_plugins" / "experiment" / "configs" / "ablations"
DATA_ROOT = shared_dir() / "data"  # the repository's data root (--data-root ../shared/data)
SMALL1 = DATA_ROOT / "omniglot" / "images_background_small1.zip"

# claim -> the config sections its settings may change (everything else must be identical)
VARIED = {
    "fastap_bins": {"loss_funcs"},
    "hard_vs_random": {"sampler"},
    "map_q_vs_t": {"loss_funcs"},
    "rll_margin_tn": {"loss_funcs"},
    "batch_size": {"trainer", "sampler"},
    "rll_query_weighting": {"loss_funcs"},
}


_SPLITS: dict[str, dict] = {}
_build_splits = builder.build_splits


@pytest.fixture(autouse=True)
def cached_splits(monkeypatch):
    """Decode the Omniglot zip once per session: every setting of a claim shares its split."""

    def build_splits(config, seed):
        key = repr((config["dataset"], config.get("split")))
        if key not in _SPLITS:
            _SPLITS[key] = _build_splits(config, seed)
        return _SPLITS[key]

    monkeypatch.setattr(builder, "build_splits", build_splits)


def _load(claim: str) -> dict[str, dict]:
    if not SMALL1.is_file():
        pytest.fail(
            f"Omniglot data missing: {SMALL1} (set PML_RANK_SHARED to the folder holding "
            "data/omniglot/images_background_small1.zip)"
        )
    # the shipped relative path, resolved under the data root as `--data-root` does
    return load_config(ABLATIONS / f"{claim}.yaml", [f"data_root={DATA_ROOT}"], check=True)


def _loss_kwargs(cfg: dict) -> tuple[type, dict]:
    name, kwargs = spec_name_and_kwargs(cfg["loss_funcs"]["metric_loss"], cfg["name"])
    return name, kwargs


def test_every_config_is_listed_in_the_driver_script():
    script = (REPO / "scripts" / "run_ablations.sh").read_text()
    listed = re.search(r"CLAIMS=\(([a-z_ ]+)\)", script).group(1).split()
    assert sorted(listed) == sorted(p.stem for p in ABLATIONS.glob("*.yaml")) == sorted(VARIED)


@pytest.mark.parametrize("claim", sorted(VARIED))
def test_settings_are_paired_and_controlled(claim):
    methods = _load(claim)
    reference = next(iter(methods))
    assert reference.endswith("(paper)"), "the first method must be the paper's default"
    ref = methods[reference]
    for name, cfg in methods.items():
        differing = {k for k in set(cfg) | set(ref) if k != "name" and cfg.get(k) != ref.get(k)}
        assert differing <= VARIED[claim], f"{name}: also changes {differing - VARIED[claim]}"
        assert cfg["seed"] == ref["seed"] and cfg["split"] == ref["split"]
    assert len(
        {str(_loss_kwargs(c)) + str(c["sampler"]) + str(c["trainer"]) for c in methods.values()}
    ) == len(methods), "two settings are identical"


def _setting_of(name: str) -> dict:
    """'L=10 (paper)' -> {'L': 10.0}; 'm=0.4 Tn=50' -> {'m': 0.4, 'Tn': 50.0}."""
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", name)}


@pytest.mark.slow  # decodes the Omniglot zip once (a few seconds) and builds every setting
@pytest.mark.parametrize("claim", sorted(VARIED))
def test_every_setting_builds_with_the_real_classes(claim):
    for name, cfg in _load(claim).items():
        exp = builder.build_experiment(cfg)
        trainer = builder.make_trainer(exp)
        loss = exp.loss_funcs["metric_loss"]
        assert type(loss).__module__.startswith("pml_rank_plugins"), name
        batch = next(iter(exp.sampler))
        assert len(batch) == trainer.batch_size, name
        setting = _setting_of(name)
        if claim == "fastap_bins":
            assert isinstance(loss, FastAPLoss) and loss.num_bins == setting["L"]
        if claim == "rll_margin_tn":
            assert isinstance(loss, RankedListLoss)
            assert (loss.margin, loss.Tn, loss.alpha) == (setting["m"], setting["Tn"], 1.2)
        if claim == "map_q_vs_t":
            assert isinstance(loss, QuantizedAPLoss) and loss.num_bins == 20
            assert loss.class_balanced == ("unbalanced" not in name)
            assert loss.tie_aware == ("mAP_T" in name)
        if claim == "batch_size":
            assert trainer.batch_size == setting["M"]
            assert isinstance(trainer, ChunkedMetricLossOnly) == ("chunked" in name)
        if claim == "hard_vs_random":
            hard = "category-hard" in name
            assert type(exp.sampler).__name__ == (
                "CategoryHardSampler" if hard else "RandomClassSampler"
            )


def _class_sizes(exp, batch) -> list[int]:
    labels = np.asarray(exp.datasets["train"].labels)[np.asarray(batch)]
    return sorted(Counter(labels[:, 0].tolist()).values())


@pytest.mark.slow  # decodes the Omniglot zip once (a few seconds) and builds every setting
def test_map_q_batches_make_class_balancing_matter():
    """At batch 80 every class has 20 items (balancing is a no-op); batch 88 mixes 20 and 4."""
    cfg = _load("map_q_vs_t")["mAP_Q balanced (paper)"]
    exp = builder.build_experiment(cfg)
    for batch in list(exp.sampler)[:5]:
        assert _class_sizes(exp, batch) == [4, 4, 20, 20, 20, 20]
    cfg["trainer"]["MetricLossOnly"]["batch_size"] = 80
    exp80 = builder.build_experiment(cfg)
    for batch in list(exp80.sampler)[:5]:
        assert set(_class_sizes(exp80, batch)) == {20}
    # and on such a batch the balanced and unbalanced losses are equal
    emb = torch.randn(80, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.as_tensor(np.asarray(exp80.datasets["train"].labels)[list(exp80.sampler)[0], 0])
    balanced = QuantizedAPLoss(num_bins=20, class_balanced=True)(emb, labels)
    plain = QuantizedAPLoss(num_bins=20)(emb, labels)
    torch.testing.assert_close(balanced, plain)


@pytest.mark.slow  # decodes the Omniglot zip once (a few seconds) and builds every setting
def test_large_batch_uses_all_five_alphabets():
    """M = 512 needs four alphabets of 128 items (two alphabets of 256 would exclude two)."""
    methods = _load("batch_size")
    exp = builder.build_experiment(methods["M=512 chunked"])
    labels = np.asarray(exp.datasets["train"].labels)
    used = set()
    for batch in exp.sampler:
        cats = Counter(labels[np.asarray(batch), 1].tolist())
        assert sorted(cats.values()) == [128] * 4
        used |= set(cats)
    assert len(used) == 5
