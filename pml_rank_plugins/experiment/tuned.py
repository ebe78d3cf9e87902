"""Tuned configs: the budget a study was tuned at, recorded by ``tune`` and enforced by
``compare --tuned``.

MLRC's fair comparison holds only when every method is trained, after tuning, at the budget it
was tuned at. ``pml-rank tune`` therefore records, per method, the complete effective config its
trials were built from (after ``--set``; :func:`budget_config`), without ``data_root`` (where the
data lives, recorded separately, is not what is trained), and its hash (:func:`config_hash`).
``pml-rank compare --tuned DIR`` builds each method from that recorded config plus the study's
``best_params`` (``tuned_configs``):

* a ``--set`` that changes a key other than the seed, device, data root, data-loader workers or
  an evaluation-only key (:func:`change_allowed`) to a value other than the tuned one is a
  :class:`~.schema.ConfigError` naming the key and the tuned value; repeating the tuning's own
  ``--set`` changes nothing and runs; ``allow_budget_change`` runs it and returns the changes
  (``summary.json`` records them);
* ``best_params`` must name exactly the keys of the recorded ``tune.space``, each value inside
  its range or choices (a study that lost its parameters, or a hand-edited ``tune.json``, is
  refused);
* the tuned comparison reports test metrics, so a method without ``eval.test`` is refused.

A ``tune.json`` written before budgets were recorded (no ``config``) is refused with the fix.
Everything here is O(size of the config).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from .schema import ConfigError, apply_set, parse_set
from .search_space import Param, apply_params, tune_section

LOGGER = logging.getLogger(__name__)
TUNE_FILE = "tune.json"
TUNE_FORMAT = 2  # 2: per-method "config", "config_hash", "data_root", "direction"
RERUN_FIX = (
    "tune again with this version into a new --out (the recorded budget cannot be recovered)"
)
# Keys a tuned comparison may change: where the data is and how runs are placed and fed, and
# what is evaluated on the test split only (validation, patience and the primary metric choose
# the best epoch, so they belong to the budget).
ALLOWED_KEYS = ("seed", "device", "data_root", "name")
ALLOWED_LAST = ("dataloader_num_workers",)
# How the same computation is executed: ``trainer.<name>.compile`` and its sub-keys.
EXECUTION_ONLY = ("compile",)
EVALUATION_ONLY = (
    "eval.test",
    "eval.revisited",
    "eval.metrics",
    "eval.recall_at_k",
    "eval.pictures",
    "compare",  # how the tables are tested (compare.equivalence_margin), not what is trained
)


def budget_config(config: Mapping) -> tuple[dict, str | None]:
    """``(budget, data_root)``: what trials train (the config without ``data_root``, its
    ``tune`` section reduced to the ``space``, since the trial count, sampler and pruner choose
    trials but train none of them), and where the data is."""
    out = copy.deepcopy(dict(config))
    root = out.pop("data_root", None)
    tune = out.pop("tune", None)
    if isinstance(tune, Mapping) and tune.get("space") is not None:
        out["tune"] = {"space": tune["space"]}
    return out, None if root is None else str(root)


def config_hash(config: Mapping) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``config`` (sorted keys)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1]}`` -> ``{"a.b": 1, "c": [1]}`` (lists are leaves)."""
    if not isinstance(config, Mapping) or (prefix and not config):
        return {prefix: config}
    out: dict[str, Any] = {}
    for k, v in config.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def differences(before: Mapping, after: Mapping) -> dict[str, tuple[Any, Any]]:
    """``{key path: (before, after)}`` for every leaf that differs (missing: ``None``)."""
    a, b = flatten(before), flatten(after)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def change_allowed(path: str) -> bool:
    """True for the keys a tuned comparison may change (see :data:`ALLOWED_KEYS`)."""
    if path in ALLOWED_KEYS or path.rsplit(".", 1)[-1] in ALLOWED_LAST:
        return True
    parts = path.split(".")
    if parts[0] == "trainer" and len(parts) > 2 and parts[2] in EXECUTION_ONLY:
        return True
    return any(path == k or path.startswith(k + ".") for k in EVALUATION_ONLY)


def load_tuned(tune_dir: str | Path) -> dict:
    """``tune.json`` of a finished ``pml-rank tune``, checked for the fields ``compare --tuned``
    needs (ConfigError naming the file and the field)."""
    path = Path(tune_dir) / TUNE_FILE
    if not path.is_file():
        raise ConfigError(
            f"--tuned {tune_dir}: no {TUNE_FILE} there (give the --out of a tune run)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON ({type(e).__name__}: {e})") from e
    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict) or not methods:
        raise ConfigError(f"{path}: no 'methods' mapping (is it a tune.json?)")
    for method, entry in methods.items():
        where = f"{path}: methods.{method}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
        if "config" not in entry:
            raise ConfigError(
                f"{where}: no recorded config (written before budgets were "
                f"recorded); {RERUN_FIX}"
            )
        if not isinstance(entry["config"], dict) or not isinstance(entry.get("config_hash"), str):
            raise ConfigError(f"{where}: 'config' must be a mapping with its 'config_hash'")
        if config_hash(entry["config"]) != entry["config_hash"]:
            raise ConfigError(
                f"{where}: the recorded config does not match its config_hash "
                "(edited by hand?); tune again or restore the file"
            )
        if entry.get("direction", "maximize") != "maximize":
            raise ConfigError(
                f"{where}.direction: {entry['direction']!r}; the objective is "
                "maximized (a study whose direction changed is refused)"
            )
        seed = entry.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{where}.seed: expected an integer, got {seed!r}")
        best = entry.get("best_params")
        if best is not None and not isinstance(best, dict):
            raise ConfigError(f"{where}.best_params: expected a mapping, got {best!r}")
    return data


def check_best_params(params: Mapping[str, Any], space: Mapping[str, Param], where: str) -> None:
    """``params`` names exactly the keys of ``space``, each value inside its range or choices."""
    missing, extra = sorted(set(space) - set(params)), sorted(set(params) - set(space))
    if extra:
        raise ConfigError(
            f"{where}: {extra[0]!r} is not a key of the method's tune.space "
            f"({sorted(space)}); only tuned keys may be applied"
        )
    if missing:
        raise ConfigError(
            f"{where}: no value for {missing[0]!r} of the tune.space (the study "
            "lost its parameters?); tune again"
        )
    for key, value in params.items():
        p = space[key]
        if p.kind == "choice":
            ok = any(type(value) is type(c) and value == c for c in p.choices)
        elif p.kind == "int":
            ok = type(value) is int and p.low <= value <= p.high
        else:
            ok = type(value) in (int, float) and math.isfinite(value) and p.low <= value <= p.high
        if not ok:
            raise ConfigError(
                f"{where}.{key}: {value!r} is outside the tune.space ({p.describe()})"
            )


def tuned_configs(
    tuned: Mapping,
    configs: Mapping[str, Mapping],
    overrides: Iterable[str] = (),
    data_root: str | None = None,
    allow_budget_change: bool = False,
    subset: bool = False,
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Each method of ``configs`` (the config files' methods, ``--set`` applied) rebuilt from its
    recorded tuned config, ``overrides`` (``--set``) and ``best_params``, on seeds after the
    tuning seed (a ``--set seed=S`` wins).

    Returns ``({method: config}, {method: [{"key", "tuned", "used", "set"}]})``; the second is
    empty unless ``allow_budget_change`` let a budget change through. ``data_root``: the
    ``--data-root`` (else the recorded one). The config files only select the methods: where a
    file now differs from the recorded config, the recorded one is used (logged). Unless
    ``subset`` (``--methods`` given), every tuned method must be in ``configs``.
    """
    entries = tuned["methods"]
    absent = [m for m in entries if m not in configs]
    if absent and not subset:
        raise ConfigError(
            f"--tuned: method {absent[0]!r} of tune.json is not in the config (have "
            f"{list(configs)}); give the config it was tuned from, or choose with --methods"
        )
    sets = parse_set(list(overrides))
    out: dict[str, dict] = {}
    changes: dict[str, list[dict]] = {}
    for method, file_cfg in configs.items():
        entry = entries.get(method)
        if entry is None:
            raise ConfigError(
                f"--tuned: method {method!r} was not tuned (have {list(entries)}); "
                "choose tuned methods with --methods"
            )
        if entry.get("best_params") is None:
            raise ConfigError(f"--tuned: method {method!r} has no complete trial")
        recorded = copy.deepcopy(entry["config"])
        root = data_root if data_root is not None else entry.get("data_root")
        drift = [
            k for k in differences(recorded, budget_config(file_cfg)[0]) if not change_allowed(k)
        ]
        cfg = copy.deepcopy(recorded)
        for path, value in sets:
            before = copy.deepcopy(cfg)
            apply_set(cfg, path, copy.deepcopy(value))
            for key, (old, new) in differences(before, cfg).items():
                if change_allowed(key):
                    continue
                change = {"key": key, "tuned": old, "used": new, "set": ".".join(path)}
                if not allow_budget_change:
                    raise ConfigError(
                        f"--set {change['set']}={new!r} changes {key} of method {method!r} from "
                        f"its tuned value {old!r}: tuned settings hold only at the budget they "
                        "were tuned at; drop the --set, or pass --allow-budget-change to run it "
                        "anyway (recorded in summary.json)"
                    )
                changes.setdefault(method, []).append(change)
        drift = [k for k in drift if k not in {c["key"] for c in changes.get(method, [])}]
        if drift:
            LOGGER.warning(
                "[%s] the config file differs from the tuned config at %s; the tuned "
                "config (tune.json) is used",
                method,
                ", ".join(drift[:5]),
            )
        where = f"--tuned: method {method!r}: best_params"
        check_best_params(entry["best_params"], tune_section(recorded)["space"], where)
        new = apply_params(cfg, entry["best_params"])
        if root is not None and not any(path == ["data_root"] for path, _ in sets):
            new["data_root"] = root
        if not (new.get("eval") or {}).get("test"):
            raise ConfigError(
                f"--tuned: method {method!r} has no eval.test split; a tuned "
                "comparison reports test metrics (set eval.test)"
            )
        if not any(path == ["seed"] for path, _ in sets):
            new["seed"] = int(entry.get("seed", cfg.get("seed", 0))) + 1
        out[method] = new
    return out, changes
