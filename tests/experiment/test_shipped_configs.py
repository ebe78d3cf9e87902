"""The shipped configs (``pml_rank_plugins/experiment/configs/*.yaml``): fair comparisons that validate
against the real classes (no stand-ins: a dropped export fails here), and ship in the package."""

from __future__ import annotations

import shutil
import warnings
import zipfile
from importlib import resources
from pathlib import Path

import pytest
import pytorch_metric_learning.losses as pml_losses

import pml_rank_plugins
from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.schema import (
    expand_methods,
    load_yaml,
    spec_name_and_kwargs,
    validate,
)
from pml_rank_plugins.experiment.shipped import resolve_config, shipped_configs
from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXPECTED = {
    "plugin FastAP": FastAPLoss,
    "plugin QuantizedAP": QuantizedAPLoss,
    "plugin RankedList": RankedListLoss,
    "PML FastAP": pml_losses.FastAPLoss,
    "PML RankedList": pml_losses.RankedListLoss,
    "PML Contrastive": pml_losses.ContrastiveLoss,
    "PML Triplet + miner": pml_losses.TripletMarginLoss,
    "PML MultiSimilarity": pml_losses.MultiSimilarityLoss,
}


def _resolved_names(spec, where):
    """Every class name in an object spec, nested ones included."""
    name, kwargs = spec_name_and_kwargs(spec, where)
    yield name
    for v in kwargs.values():
        if isinstance(v, dict) and len(v) == 1 and str(next(iter(v)))[:1].isupper():
            yield from _resolved_names(v, where)


@pytest.mark.parametrize("name", ["default.yaml", "omniglot.yaml"])
def test_shipped_config_is_a_fair_validated_comparison(name):
    methods = expand_methods(load_yaml(CONFIGS / name))
    assert set(methods) == set(EXPECTED)
    shared = None
    for method, cfg in methods.items():
        validate(cfg)
        loss_name, _ = spec_name_and_kwargs(cfg["loss_funcs"]["metric_loss"], method)
        assert registry.resolve(loss_name) is EXPECTED[method], method
        rest = {k: v for k, v in cfg.items() if k not in ("name", "loss_funcs", "mining_funcs")}
        # a method's search space is its own; the tuning budget (trials, sampler, pruner) is shared
        space = (rest.pop("tune", None) or {}).pop("space", None)
        if "tune" in cfg:
            assert space and all(p.startswith("loss_funcs.") for p in space), method
            rest["tune"] = {k: v for k, v in cfg["tune"].items() if k != "space"}
        shared = rest if shared is None else shared
        assert rest == shared, f"{method}: differs from the others outside the loss/miner"
    triplet = methods["PML Triplet + miner"]["mining_funcs"]["tuple_miner"]
    assert "TripletMarginMiner" in triplet
    assert {m for m, c in methods.items() if c.get("mining_funcs")} == {"PML Triplet + miner"}


@pytest.mark.parametrize("name", ["default.yaml", "omniglot.yaml"])
def test_shipped_config_classes_are_the_packages_own(name):
    """Dataset, model, sampler and split resolve to this package's real classes (exports)."""
    cfg = next(iter(expand_methods(load_yaml(CONFIGS / name)).values()))
    for slot in ("dataset", "sampler"):
        obj = registry.resolve(spec_name_and_kwargs(cfg[slot], slot)[0])
        assert obj.__module__.startswith("pml_rank_plugins."), (slot, obj)
    trunk = registry.resolve(spec_name_and_kwargs(cfg["models"]["trunk"], "trunk")[0])
    assert trunk.__module__.startswith("pml_rank_plugins.models"), trunk
    split = {k: v for k, v in cfg["split"].items() if k not in ("names", "query_gallery")}
    split_fn = registry.resolve(spec_name_and_kwargs(split, "split")[0])
    assert split_fn.__module__.startswith("pml_rank_plugins."), split_fn


def test_configs_are_package_data_and_usable_by_name(tmp_path, monkeypatch):
    """Shipped inside the package (what a wheel installs) and found by name from any folder."""
    root = resources.files("pml_rank_plugins.experiment.configs")
    assert {p.name for p in root.iterdir()} >= {"default.yaml", "omniglot.yaml"}
    assert Path(str(root)).resolve().is_relative_to(Path(pml_rank_plugins.__file__).parent)
    assert {"default", "omniglot"} <= set(shipped_configs())
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert resolve_config("default") == shipped_configs()["default"]
    assert resolve_config("omniglot.yaml") == shipped_configs()["omniglot"]
    assert resolve_config("configs/default.yaml") == shipped_configs()["default"]
    own = tmp_path / "default"
    own.write_text("seed: 1\n")
    assert resolve_config("default") == Path("default")  # a path wins over a shipped name
    with pytest.raises(ValueError, match="shipped configs: .*default.*omniglot"):
        resolve_config("nope")


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory):
    """Build the wheel once (setuptools' PEP 517 backend, in process, no network) in a copy of
    the sources; yields (the wheel's path, the warnings raised while building it)."""
    build_meta = pytest.importorskip("setuptools.build_meta")
    tmp_path = tmp_path_factory.mktemp("wheel")
    repo = CONFIGS.parent
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "CITATION.cff"):  # license-files
        shutil.copy(repo / name, src / name)
    shutil.copytree(
        repo / "pml_rank_plugins",
        src / "pml_rank_plugins",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(src)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # also the ones already shown once in this process
            wheel = build_meta.build_wheel(str(tmp_path / "dist"))
    finally:
        monkeypatch.undo()
    return tmp_path / "dist" / wheel, caught


def test_wheel_contains_the_configs(built_wheel):
    names = zipfile.ZipFile(built_wheel[0]).namelist()
    for shipped in shipped_configs():
        assert f"pml_rank_plugins/experiment/configs/{shipped}.yaml" in names, shipped
    assert "pml_rank_plugins/__main__.py" in names


def test_wheel_builds_without_warnings(built_wheel):
    """setuptools' deprecations (e.g. a `license` table instead of an SPDX string) surface as
    warnings long before they break the build."""
    from_setuptools = [
        f"{w.category.__name__}: {str(w.message).strip().splitlines()[0]}"
        for w in built_wheel[1]
        if "setuptools" in (w.filename or "") or "setuptools" in w.category.__module__
    ]
    assert not from_setuptools, from_setuptools
    metadata = zipfile.ZipFile(built_wheel[0]).read("pml_rank_plugins-0.1.0.dist-info/METADATA")
    assert b"License-Expression: MIT" in metadata
