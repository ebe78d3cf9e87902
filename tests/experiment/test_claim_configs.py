"""The papers' claims at the study's converged budget (configs/claims/, issue 27 item 5).

Each claim must start from its loss's tuned setting and change only what the claim is about:

* every section but ``methods`` and ``compare`` equals the study's (configs/studies/omniglot.yaml:
  data, split, trunk, sampler, optimizer, trainer budget, evaluation), with the study's seed 0
  moved to 1 (the tuned and default test runs use seeds 1-10) and the tuned learning rate;
* the claim's first method (its reference) is the study's method with the study's recorded best
  parameters applied (``docs/study/tune/tune.json`` when published, else the committed Optuna
  storage ``docs/study/tune/tune.db``);
* every other method differs from the reference only at the keys this file declares for it;
* a reference may leave the study's setting only where this file says so (``REFERENCE_CHANGES``:
  class balancing needs batches with classes of unequal size).

The expected values are read from the study's files, never from the claim configs; a tuning
that moves a best parameter (e.g. topped-up trials) fails here until the claims follow.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml

from pml_rank_plugins.experiment import builder, collect_methods
from pml_rank_plugins.losses import QuantizedAPLoss
from tests.data.conftest import shared_dir

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "configs" / "studies" / "omniglot.yaml"
CLAIMS = ROOT / "configs" / "claims"
TUNED = ROOT / "docs" / "study" / "tune"
DATA_ROOT = shared_dir() / "data"  # the repository's data root (--data-root ../shared/data)
SMALL1 = DATA_ROOT / "omniglot" / "images_background_small1.zip"

# claim -> (the study's method it starts from, {method: the dotted key paths it may change})
DECLARED: dict[str, tuple[str, dict[str, set[str]]]] = {
    "fastap_bins": (
        "plugin FastAP",
        {m: {"loss_funcs.metric_loss.num_bins"} for m in ("L=10 (paper)", "L=5", "L=20")},
    ),
    "batch_size": (
        "plugin FastAP",
        {
            "M=40": {"trainer.MetricLossOnly.batch_size"},
            "M=160": {"trainer.MetricLossOnly.batch_size"},
            "M=320 chunked": {"trainer", "sampler.CategoryHardSampler.categories_per_batch"},
        },
    ),
    "hard_vs_random": ("plugin FastAP", {"random classes": {"sampler"}}),
    "map_q_vs_t": (
        "plugin QuantizedAP",
        {
            "mAP_Q unbalanced": {"loss_funcs.metric_loss.class_balanced"},
            "mAP_T balanced": {"loss_funcs.metric_loss.tie_aware"},
        },
    ),
    "rll_margin_tn": (
        "plugin RankedList",
        {
            "m=0": {"loss_funcs.metric_loss.margin"},
            "Tn=0": {"loss_funcs.metric_loss.Tn"},
            "Tn=50": {"loss_funcs.metric_loss.Tn"},
            "paper defaults (m 0.4, alpha 1.2, Tn 10)": {
                "loss_funcs.metric_loss.margin",
                "loss_funcs.metric_loss.alpha",
                "loss_funcs.metric_loss.Tn",
            },
        },
    ),
    "rll_query_weighting": (
        "plugin RankedList",
        {"weight share (Caffe layer)": {"loss_funcs.metric_loss.query_weighting"}},
    ),
    "class_balancing": (
        "plugin QuantizedAP",
        {"mAP_Q unbalanced (batch 88)": {"loss_funcs.metric_loss.class_balanced"}},
    ),
}
# a reference that must leave the study's setting for its claim to be testable, and how:
# class balancing is a no-op at batch 80 (test_class_balancing_changes_the_loss_at_batch_88)
REFERENCE_CHANGES = {"class_balancing": {"trainer.MetricLossOnly.batch_size": 88}}
# keys a claim's reference may add to the study's method: options whose value is the class's
# default (stated explicitly in the claim so its variants read as one change)
EXPLICIT_DEFAULTS = {
    "map_q_vs_t": {"loss_funcs.metric_loss.class_balanced": True},
    "rll_query_weighting": {"loss_funcs.metric_loss.query_weighting": "mean"},
    "class_balancing": {"loss_funcs.metric_loss.class_balanced": True},
}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def merge(base: dict, over: dict) -> dict:
    """A method's entries over the shared sections (mappings merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_path(config: dict, path: str, value) -> None:
    """Set a tuned key path: ``optimizers.trunk_optimizer.lr`` reaches the keyword of the one
    class under ``trunk_optimizer`` (``{Adam: {lr: ...}}``), as the tuner's paths do."""
    node = config
    keys = path.split(".")
    for key in keys[:-1]:
        if key not in node and len(node) == 1:
            node = next(iter(node.values()))  # the class name level
        node = node[key]
    if keys[-1] not in node and len(node) == 1 and isinstance(next(iter(node.values())), dict):
        node = next(iter(node.values()))
    node[keys[-1]] = value


def flatten(tree, prefix: str = "") -> dict[str, object]:
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def best_params(tmp_path: Path) -> dict[str, dict]:
    published = TUNED / "tune.json"
    if published.exists():
        return {
            m: s["best_params"] for m, s in json.loads(published.read_text())["methods"].items()
        }
    copy_db = tmp_path / "tune.db"  # read a copy: the committed storage is never opened for writing
    shutil.copyfile(TUNED / "tune.db", copy_db)
    storage = optuna.storages.RDBStorage(f"sqlite:///{copy_db}")
    try:
        out = {}
        for summary in optuna.get_all_study_summaries(storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
            if done:
                out[summary.study_name] = dict(max(done, key=lambda t: t.value).params)
        return out
    finally:
        storage.engine.dispose()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict[str, dict]:
    return best_params(tmp_path_factory.mktemp("tuned"))


def changed(a: dict, b: dict) -> set[str]:
    fa, fb = flatten(a), flatten(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k, object()) != fb.get(k, object())}


def covered(path: str, declared: set[str]) -> bool:
    """A changed leaf path is allowed when a declared path is its prefix or names its last keys
    past the class level (``loss_funcs.metric_loss.num_bins`` covers
    ``loss_funcs.metric_loss.pml_rank_plugins.FastAPLoss.num_bins``)."""
    parts = path.split(".")
    for d in declared:
        dp = d.split(".")
        if path == d or path.startswith(d + "."):
            return True
        if parts[: len(dp) - 1] == dp[:-1] and parts[-1] == dp[-1]:
            return True
    return False


def test_every_claim_config_is_declared_here():
    assert sorted(p.stem for p in CLAIMS.glob("*.yaml")) == sorted(DECLARED)


@pytest.mark.parametrize("claim", sorted(DECLARED))
def test_a_claim_is_the_study_at_its_tuned_setting_but_for_what_it_tests(claim, tuned):
    source, variants = DECLARED[claim]
    study, config = load(STUDY), load(CLAIMS / f"{claim}.yaml")
    methods = config.pop("methods")
    config.pop("compare")
    shared = {k: v for k, v in study.items() if k not in ("methods", "compare", "tune")}
    shared["seed"] = 1
    assert source in tuned, f"the study has no tuned {source!r} yet"

    # the reference: the study's method, its best parameters applied
    expected = merge(shared, {k: v for k, v in study["methods"][source].items() if k != "tune"})
    for path, value in tuned[source].items():
        set_path(expected, path, value)
    for path, value in {
        **EXPLICIT_DEFAULTS.get(claim, {}),
        **REFERENCE_CHANGES.get(claim, {}),
    }.items():
        set_path(expected, path, value)
    reference_name = next(iter(methods))
    reference = merge(config, methods[reference_name])
    assert reference == expected, changed(reference, expected)

    # every other setting: the reference but for its declared keys (and at least one of them)
    assert set(methods) - {reference_name} == set(variants)
    for name, declared in variants.items():
        diff = changed(merge(config, methods[name]), reference)
        assert diff, f"{claim}: {name!r} equals the reference"
        assert all(covered(p, declared) for p in diff), (name, sorted(diff))


def test_the_budget_is_the_studys():
    study = load(STUDY)
    trainer = study["trainer"]["MetricLossOnly"]
    assert (trainer["num_epochs"], trainer["iterations_per_epoch"]) == (25, 50)
    for path in CLAIMS.glob("*.yaml"):
        config = load(path)
        assert config["eval"] == study["eval"], path.name
        margin = config["compare"]["equivalence_margin"]
        assert isinstance(margin, float) and margin > 0, path.name


def test_the_checker_sees_a_change_outside_the_declared_keys():
    """The comparison above can fail: an undeclared change is reported."""
    base = {"loss_funcs": {"metric_loss": {"X": {"num_bins": 41, "gamma": 1.0}}}}
    other = merge(base, {"loss_funcs": {"metric_loss": {"X": {"num_bins": 10, "gamma": 2.0}}}})
    diff = changed(other, base)
    assert diff == {"loss_funcs.metric_loss.X.num_bins", "loss_funcs.metric_loss.X.gamma"}
    assert not all(covered(p, {"loss_funcs.metric_loss.num_bins"}) for p in diff)
    assert covered("loss_funcs.metric_loss.X.num_bins", {"loss_funcs.metric_loss.num_bins"})


def test_the_study_driver_runs_every_claim():
    script = (ROOT / "scripts" / "run_study.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("ALL_CLAIMS="))
    assert sorted(line.split("=", 1)[1].strip('"').split()) == sorted(DECLARED)


@pytest.mark.slow  # decodes the Omniglot zip once (a few seconds) and builds the setting
def test_class_balancing_changes_the_loss_at_batch_88():
    """At the study's batch of 80 every class of a batch has its 20 images, so the balanced and
    unbalanced mAP_Q are the same loss (claim map_q_vs_t trained bit-identical runs); the
    class_balancing claim's batch of 88 holds classes of 20 and of 4 images, where they differ."""
    if not SMALL1.is_file():
        pytest.fail(f"Omniglot data missing: {SMALL1}")
    methods = collect_methods([CLAIMS / "class_balancing.yaml"], [], None, str(DATA_ROOT))
    exp = builder.build_experiment(next(iter(methods.values())).config)
    labels_all = np.asarray(exp.datasets["train"].labels)[:, 0]
    batches = list(exp.sampler)[:5]
    emb = torch.randn(88, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for batch in batches:
        labels = labels_all[np.asarray(batch)]
        assert sorted(Counter(labels.tolist()).values()) == [4, 4, 20, 20, 20, 20]
    labels = torch.as_tensor(labels_all[np.asarray(batches[0])])
    balanced = QuantizedAPLoss(num_bins=46, class_balanced=True)(emb, labels)
    plain = QuantizedAPLoss(num_bins=46, class_balanced=False)(emb, labels)
    assert not torch.allclose(balanced, plain)
    # and at batch 80 (the map_q_vs_t claim's) they are the same loss
    cfg = load(CLAIMS / "map_q_vs_t.yaml")
    cfg80 = collect_methods([CLAIMS / "map_q_vs_t.yaml"], [], None, str(DATA_ROOT))
    exp80 = builder.build_experiment(next(iter(cfg80.values())).config)
    batch80 = next(iter(exp80.sampler))
    labels80 = torch.as_tensor(np.asarray(exp80.datasets["train"].labels)[np.asarray(batch80), 0])
    assert cfg["trainer"]["MetricLossOnly"]["batch_size"] == len(batch80) == 80
    emb80 = emb[:80]
    torch.testing.assert_close(
        QuantizedAPLoss(num_bins=46, class_balanced=True)(emb80, labels80),
        QuantizedAPLoss(num_bins=46, class_balanced=False)(emb80, labels80),
    )
