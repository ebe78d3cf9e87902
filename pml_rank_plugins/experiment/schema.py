"""Experiment configs: YAML loading, merging, ``--set`` overrides, method expansion, validation.

A config is one YAML mapping in powerful-benchmarker's shape (see ``configs/default.yaml`` and
:doc:`/configs`). Objects are written ``{ClassName: {kwargs}}`` (an *object spec*); kwargs may hold
further object specs (distances, reducers, transforms). A ``methods:`` mapping turns one file
into several experiments: each method is a partial config deep-merged over the rest of the file.

A nested ``{name: {...}}`` mapping is read as an object only when ``name`` looks like a class:
capitalised (``CosineSimilarity``), dotted (``torchvision.models.resnet18``) or prefixed
(``plugin:FastAPLoss``); other mappings stay plain dicts. At the fixed slots (``dataset``,
``models.*``, ``loss_funcs.*``, ...) any resolvable name works, lower-case factories included.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Iterable

from . import registry, values
from .errors import ConfigError
from .yamlfile import (  # noqa: F401 -- re-exported (schema is where callers import them from)
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    ConfigLoader,
    dump_yaml,
    load_yaml,
    parse_yaml,
)

TOP_LEVEL_KEYS = {
    "name",
    "seed",
    "dataset",
    "datasets",
    "transforms",
    "data_root",
    "split",
    "models",
    "loss_funcs",
    "mining_funcs",
    "sampler",
    "optimizers",
    "lr_schedulers",
    "trainer",
    "eval",
    "methods",
    "device",
    "tune",
    "compare",
}
# ``compare:``: settings of the comparison tables, not of training (see docs/statistics.md).
COMPARE_KEYS = {"equivalence_margin"}
EVAL_KEYS = {
    "tester",
    "metrics",
    "recall_at_k",
    "k",
    "validation",
    "test",
    "primary_metric",
    "test_interval",
    "patience",
    "revisited",
    "pictures",
}
_CLASSLIKE = re.compile(r"^(plugin:|pml:)?[A-Za-z_][\w.]*$")


# Marks a key present on one side only in :func:`config_diff`.
MISSING = type("Missing", (), {"__repr__": lambda self: "<absent>"})()


def config_diff(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``[(dotted path, old value, new value)]`` for every leaf that differs (mappings are
    compared key by key, everything else as a whole; :data:`MISSING` marks an absent key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in list(old) + [k for k in new if k not in old]:
            path = f"{prefix}.{k}" if prefix else str(k)
            out += config_diff(old.get(k, MISSING), new.get(k, MISSING), path)
        return out
    return [] if old == new else [(prefix, old, new)]


def is_object_spec(value: Any) -> bool:
    """True for ``{Name: kwargs-or-None}`` where ``Name`` looks like a class (capitalised, dotted
    or prefixed). Lower-case single-key mappings (``{metric_loss: ...}``) are plain dicts."""
    if not isinstance(value, dict) or len(value) != 1:
        return False
    name, kwargs = next(iter(value.items()))
    if not isinstance(name, str) or not _CLASSLIKE.match(name):
        return False
    if not (kwargs is None or isinstance(kwargs, dict)):
        return False
    return name[0].isupper() or ":" in name or "." in name


def spec_name_and_kwargs(spec: Any, where: str) -> tuple[str, dict]:
    """Split an object spec at a slot that must hold one (a bare string means no kwargs)."""
    if isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: expected {{ClassName: {{kwargs}}}}, got {spec!r}")
    name, kwargs = next(iter(spec.items()))
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}.{name}: kwargs must be a mapping, got {kwargs!r}")
    return name, kwargs


def deep_merge(base: Any, override: Any) -> Any:
    """Merge ``override`` into a copy of ``base``.

    Mappings merge key by key; ``None`` in ``override`` deletes the key; an object spec naming a
    *different* class replaces the base spec instead of merging two class names into one mapping.
    """
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    if is_object_spec(override) and is_object_spec(base) and set(base) != set(override):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif k in out:
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_set(assignments: Iterable[str]) -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=[1, 2]"]`` -> ``[(["a", "b"], 1), (["c"], [1, 2])]`` (values are YAML)."""
    out = []
    for a in assignments or ():
        if "=" not in a:
            raise ConfigError(f"--set {a!r}: expected key.path=value")
        key, _, raw = a.partition("=")
        path = [p for p in key.strip().split(".") if p]
        if not path:
            raise ConfigError(f"--set {a!r}: empty key")
        out.append((path, parse_yaml(raw, f"--set {key.strip()}")))
    return out


def apply_set(config: dict, path: list[str], value: Any) -> dict:
    """Set ``config[path] = value`` in place and return ``config``.

    A path segment missing at an object spec descends into the spec's kwargs, so
    ``trainer.num_epochs=2`` reaches ``trainer: {MetricLossOnly: {num_epochs: ...}}`` without
    naming the class. Missing intermediate mappings are created.
    """
    node = config
    for i, key in enumerate(path[:-1]):
        if isinstance(node, dict) and key not in node and is_object_spec(node):
            node = next(iter(node.values()))
            if node is None:
                raise ConfigError(f"--set {'.'.join(path)}: spec has no kwargs mapping")
        if not isinstance(node, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is not a mapping")
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
    last = path[-1]
    if isinstance(node, dict) and last not in node and is_object_spec(node):
        inner = next(iter(node.values()))
        if inner is None:
            inner = node[next(iter(node))] = {}
        node = inner
    if not isinstance(node, dict):
        raise ConfigError(f"--set {'.'.join(path)}: parent is not a mapping")
    node[last] = value
    return config


def expand_methods(config: dict, default_name: str = "run") -> dict[str, dict]:
    """``{method name: full config}``; a config without ``methods`` is one method."""
    methods = config.get("methods")
    base = {k: v for k, v in config.items() if k != "methods"}
    name = base.get("name", default_name)
    if not isinstance(name, str):
        raise ConfigError(f"name: expected a string, got {name!r}")
    if methods is not None and not isinstance(methods, dict):
        raise ConfigError(
            f"methods: expected a mapping {{method name: partial config}}, got "
            f"{type(methods).__name__} {_shown(methods)}"
        )
    if not methods:
        return {name: base}
    if not isinstance(methods, dict):
        raise ConfigError("methods: expected a mapping {method name: partial config}")
    out = {}
    for name, partial in methods.items():
        if partial is not None and not isinstance(partial, dict):
            raise ConfigError(
                f"methods.{name}: expected a mapping (the method's partial config), got "
                f"{type(partial).__name__} {_shown(partial)}"
            )
        cfg = deep_merge(base, partial or {})
        # A search space's one-key mappings look like object specs to deep_merge; a method's
        # tune.space entries extend or replace the top-level ones key by key.
        tunes = [c.get("tune") for c in (base, partial or {})]
        for where, t in zip(("tune", f"methods.{name}.tune"), tunes):
            if t is not None and not isinstance(t, dict):
                raise ConfigError(
                    f"{where}: expected a mapping with trials/sampler/pruner/space, got "
                    f"{type(t).__name__} {_shown(t)}"
                )
        spaces = [(t or {}).get("space") for t in tunes]
        if all(isinstance(sp, dict) for sp in spaces):
            cfg["tune"]["space"] = {**spaces[0], **spaces[1]}
        cfg["name"] = str(name)
        out[str(name)] = cfg
    return out


def load_config(
    path: str | Path, overrides: Iterable[str] = (), check: bool = True
) -> dict[str, dict]:
    """Load a config file, expand its methods and apply ``--set`` overrides to each one.

    ``check=False`` skips :func:`validate` (callers that select methods validate those only).
    """
    raw = load_yaml(path)
    expanded = expand_methods(raw, default_name=Path(path).stem)
    sets = parse_set(overrides)
    for cfg in expanded.values():
        for p, v in sets:
            apply_set(cfg, p, copy.deepcopy(v))
        if check:
            validate(cfg)
    return expanded


def _walk_specs(value: Any, where: str):
    """Yield (where, name, kwargs) for every object spec nested in ``value``."""
    if is_object_spec(value):
        name, kwargs = next(iter(value.items()))
        yield where, name, kwargs or {}
        for k, v in (kwargs or {}).items():
            yield from _walk_specs(v, f"{where}.{name}.{k}")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_specs(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_specs(v, f"{where}[{i}]")


# Top-level sections that must be mappings when present (a `--set optimizers=5` or a YAML list
# there would otherwise fail deep inside with an AttributeError).
MAPPING_SECTIONS = (
    "models",
    "loss_funcs",
    "trainer",
    "eval",
    "split",
    "transforms",
    "tune",
    "mining_funcs",
    "optimizers",
    "lr_schedulers",
    "datasets",
    "compare",
)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(config: dict) -> dict:
    """Check structure, that every class name resolves and that every keyword is accepted.

    Raises :class:`ConfigError` (structure), :class:`~pml_rank_plugins.experiment.UnknownNameError`
    (unknown name, with the closest matches) or ``TypeError`` (bad keyword, with the class's
    signature). Keywords the runner injects (``labels``, ``batch_size``, model parameters) are not
    required.
    """
    unknown = set(config) - TOP_LEVEL_KEYS
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s) {sorted(map(str, unknown))}; "
            f"allowed: {sorted(TOP_LEVEL_KEYS)}"
        )
    for key in ("models", "loss_funcs", "trainer"):
        if key not in config:
            raise ConfigError(f"missing required section {key!r}")
    if "methods" in config:  # validate sees expanded methods; only a --set can put it back
        raise ConfigError(
            "methods: a --set cannot add or change methods (they are expanded before --set "
            "applies); edit the config, and choose methods with --methods"
        )
    for key in MAPPING_SECTIONS:
        value = config.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{key}: expected a mapping (key: value lines), got {type(value).__name__} "
                f"{_shown(value)}"
            )
    for key in ("models", "loss_funcs", "optimizers", "mining_funcs", "lr_schedulers"):
        for name, spec in (config.get(key) or {}).items():
            if spec is not None and not isinstance(spec, (dict, str)):
                raise ConfigError(
                    f"{key}.{name}: expected {{ClassName: {{kwargs}}}}, got "
                    f"{type(spec).__name__} {_shown(spec)}"
                )
    if ("dataset" in config) == ("datasets" in config):
        raise ConfigError(
            "give exactly one of 'dataset' (one dataset, cut by 'split') or 'datasets' "
            "({split name: dataset spec}, e.g. train: {CUB200: {split: train}})"
        )
    if "trunk" not in (config.get("models") or {}):
        raise ConfigError("models: needs at least 'trunk'")
    if "metric_loss" not in (config.get("loss_funcs") or {}):
        raise ConfigError("loss_funcs: needs 'metric_loss'")
    ev = config.get("eval") or {}
    if not isinstance(ev, dict):
        raise ConfigError(f"eval: expected a mapping, got {ev!r}")
    bad = set(ev) - EVAL_KEYS
    if bad:
        raise ConfigError(
            f"eval: unknown key(s) {sorted(map(str, bad))}; allowed: {sorted(EVAL_KEYS)}"
        )
    equivalence_margin(config)
    datasets = config.get("datasets")
    if datasets is not None and not isinstance(datasets, dict):
        raise ConfigError("datasets: expected {split name: {DatasetClass: {kwargs}}}")
    slots = {
        **({"dataset": config["dataset"]} if "dataset" in config else {}),
        **{f"datasets.{k}": v for k, v in (datasets or {}).items()},
        **{
            f"transforms.{kind}[{i}]": item
            for kind, items in (config.get("transforms") or {}).items()
            if isinstance(items, list)
            for i, item in enumerate(items)
        },
        **{
            f"eval.revisited[{i}].dataset": e["dataset"]
            for i, e in enumerate(ev.get("revisited") or [])
            if isinstance(e, dict) and "dataset" in e
        },
        "trainer": config["trainer"],
        **{f"models.{k}": v for k, v in config["models"].items()},
        **{f"loss_funcs.{k}": v for k, v in config["loss_funcs"].items()},
        **{f"mining_funcs.{k}": v for k, v in (config.get("mining_funcs") or {}).items()},
        **{f"optimizers.{k}": v for k, v in (config.get("optimizers") or {}).items()},
        **{f"lr_schedulers.{k}": v for k, v in (config.get("lr_schedulers") or {}).items()},
    }
    if config.get("sampler"):
        slots["sampler"] = config["sampler"]
    split_fn = {k: v for k, v in (config.get("split") or {}).items() if k not in SPLIT_KEYS}
    if split_fn:
        slots["split"] = split_fn
    if ev.get("tester"):
        slots["eval.tester"] = ev["tester"]
    values.check_values(
        config,
        spec_name_and_kwargs(ev["tester"], "eval.tester") if ev.get("tester") else None,
        spec_name_and_kwargs(config["trainer"], "trainer"),
    )
    for where, spec in slots.items():
        if spec is None:
            continue
        name, kwargs = spec_name_and_kwargs(spec, where)
        obj = registry.resolve(name, where)
        own = {k: v for k, v in kwargs.items() if k not in RUNNER_KWARGS.get(where, ())}
        registry.check_keywords(obj, own, where, name)
        _check_plugin_twin(where, name, obj, kwargs)
        for w, n, kw in _walk_specs(kwargs, f"{where}.{name}"):
            inner = registry.resolve(n, w)
            registry.check_keywords(inner, kw, w, n)
            _check_plugin_twin(w, n, inner, kw)
    return config


def equivalence_margin(config: dict) -> float | None:
    """The config's ``compare.equivalence_margin`` (points of the primary metric: ``1.0`` is
    +-0.01 as a fraction), checked; ``None`` when absent or null (no equivalence test).

    Raises:
        ConfigError: ``compare`` is not a mapping or has unknown keys, or the margin is not a
            positive finite number (0, negatives, strings, booleans, inf and NaN are refused).
    """
    section = config.get("compare")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"compare: expected a mapping, got {section!r}")
    bad = set(section) - COMPARE_KEYS
    if bad:
        raise ConfigError(
            f"compare: unknown key(s) {sorted(map(str, bad))}; allowed: {sorted(COMPARE_KEYS)}"
        )
    value = section.get("equivalence_margin")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"compare.equivalence_margin: expected a positive finite number of points of the"
            f" primary metric (e.g. 1.0 for +-1 point), got {value!r}"
        )
    return float(value)


def _check_plugin_twin(where: str, name: str, obj: Any, kwargs: dict) -> None:
    """PML's ``CrossBatchMemory`` (and any PML class the plugin re-implements) wrapping one of
    our classes: point to the plugin's version instead of failing deep inside PML."""
    twin = registry.plugin_twin(obj)
    if twin is None:
        return
    for w, n, _ in _walk_specs(kwargs, f"{where}.{name}"):
        if registry.is_plugin_object(registry.resolve(n, w)):
            raise ConfigError(
                f"{where}: the bare name {name!r} is PML's class, which does not accept the "
                f"plugin's {n} ({w}); write {twin} instead"
            )


# Keywords the runner consumes itself (not passed to the class).
RUNNER_KWARGS = {"trainer": ("num_epochs", "amp", "compile")}
# Keys of ``split:`` other than the split function spec.
SPLIT_KEYS = ("names", "query_gallery", "fold")
