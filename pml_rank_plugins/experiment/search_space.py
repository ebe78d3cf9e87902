"""Search spaces for ``pml-rank tune``: the ``tune:`` section of a config, parsed and checked.

A config's ``tune`` section (top level, and per method under ``methods.<name>.tune``; a method's
entries extend or replace the top-level ones key by key, like every other method key)::

    tune:
      trials: 20
      sampler: {TPESampler: {seed: 0}}          # a class of optuna.samplers
      pruner: {MedianPruner: {n_warmup_steps: 1}}   # a class of optuna.pruners, or null
      space:
        loss_funcs.metric_loss.num_bins: {int: [5, 40]}
        optimizers.trunk_optimizer.lr: {float: [1.0e-5, 1.0e-2], log: true}
        trainer.batch_size: {choice: [32, 64]}

Space keys are ``--set`` key paths (:func:`.schema.apply_set`: a path passes through an object
spec without naming its class). A key must exist in the method's config, or name a keyword that
the class of the enclosing object spec accepts. Every mistake is a :class:`ConfigError` naming the
key: an unknown kind, ``low > high``, ``log`` with ``low <= 0``, an ``int`` range with non-integer
bounds, an empty or non-scalar ``choice``, a key path the config does not have.

Cost: O(size of the config) per key. ``tune.sampler`` and ``tune.pruner`` name classes of
``optuna.samplers`` and ``optuna.pruners`` only (:func:`optuna_object`).
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from . import registry
from .schema import ConfigError, apply_set, is_object_spec

KINDS = ("int", "float", "choice")
TUNE_KEYS = {"trials", "sampler", "pruner", "space"}
DEFAULT_TRIALS = 20
DEFAULT_SAMPLER = {"TPESampler": {"seed": 0}}
DEFAULT_PRUNER = {"MedianPruner": {"n_warmup_steps": 1}}
UNTUNABLE = ("split", "dataset", "eval")  # top-level sections a space may not reach
_SCALARS = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Param:
    """One dimension of a search space: ``path`` (a ``--set`` key path) and its distribution."""

    path: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple = ()

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice {list(self.choices)}"
        return f"{self.kind} [{self.low}, {self.high}]" + (" log" if self.log else "")


def _number(value: Any, where: str) -> float:
    try:  # an int beyond float's range (10**400) overflows in isfinite
        ok = not isinstance(value, bool) and isinstance(value, (int, float))
        ok = ok and math.isfinite(value)
    except OverflowError:
        ok = False
    if not ok:
        raise ConfigError(f"{where}: bounds must be finite numbers, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_param(path: str, spec: Any, where: str) -> Param:
    """One ``key.path: {int|float: [low, high], log: bool} | {choice: [...]}`` entry."""
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: expected {{int: [low, high]}}, {{float: [low, high]}} or "
            f"{{choice: [...]}}, got {spec!r}"
        )
    kinds = [k for k in spec if k in KINDS]
    extra = set(spec) - set(KINDS) - {"log"}
    if len(kinds) != 1 or extra:
        raise ConfigError(
            f"{where}: give exactly one of {list(KINDS)} (and optionally log: true), got keys "
            f"{sorted(map(str, spec))}"
        )
    kind = kinds[0]
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log: expected true or false, got {log!r}")
    if kind == "choice":
        if log:
            raise ConfigError(f"{where}: log applies to int and float ranges, not to choice")
        choices = spec["choice"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choice: expected a non-empty list, got {choices!r}")
        bad = [c for c in choices if not isinstance(c, _SCALARS)]
        if bad:
            raise ConfigError(
                f"{where}.choice: values must be numbers, strings, booleans or null; got {bad[0]!r}"
            )
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{where}.choice: lists a value twice: {choices}")
        return Param(path, kind, choices=tuple(choices))
    bounds = spec[kind]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise ConfigError(f"{where}.{kind}: expected [low, high], got {bounds!r}")
    low, high = (_number(b, f"{where}.{kind}") for b in bounds)
    if kind == "int" and not all(float(b).is_integer() for b in (low, high)):
        raise ConfigError(f"{where}.int: bounds must be integers, got {bounds}")
    if low > high:
        raise ConfigError(f"{where}.{kind}: low {low} > high {high}")
    if log and low <= 0:
        raise ConfigError(f"{where}: log needs low > 0, got low {low}")
    if kind == "int":
        low, high = int(low), int(high)
    else:
        low, high = float(low), float(high)
    return Param(path, kind, low, high, log)


def _leaf_exists(config: dict, path: list[str]) -> bool:
    """True when ``path`` (``--set`` semantics) names an existing key of ``config``, or a keyword
    the class of the enclosing object spec accepts."""
    node: Any = config
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, dict) and key not in node and is_object_spec(node):
            name, kwargs = next(iter(node.items()))
            if last:
                if kwargs and key in kwargs:
                    return True
                try:
                    accepted = registry.accepted_keywords(registry.resolve(name))
                except Exception:  # an unknown class is the schema check's error, not ours
                    return False
                return accepted is None or key in accepted
            node = kwargs or {}
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def tune_section(config: Mapping, where: str = "tune") -> dict:
    """The config's ``tune`` section with defaults, checked (its ``space`` parsed into
    ``{path: Param}``). A config without ``tune`` gets the defaults and an empty space."""
    section = config.get("tune") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys {sorted(TUNE_KEYS)}")
    unknown = set(section) - TUNE_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed {sorted(TUNE_KEYS)}"
        )
    trials = section.get("trials", DEFAULT_TRIALS)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"{where}.trials: expected an integer >= 1, got {trials!r}")
    space = section.get("space")
    space = {} if space is None else space
    if not isinstance(space, Mapping):
        raise ConfigError(
            f"{where}.space: expected a mapping {{key.path: {{int|float|choice: ...}}}}, got "
            f"{type(space).__name__} {_shown(space)}"
        )
    params = {
        str(path): parse_param(str(path), spec, f"{where}.space.{path}")
        for path, spec in space.items()
    }
    for slot in ("sampler", "pruner"):
        spec = section.get(slot, DEFAULT_SAMPLER if slot == "sampler" else DEFAULT_PRUNER)
        if spec is not None and not (
            isinstance(spec, str) or (isinstance(spec, Mapping) and len(spec) == 1)
        ):
            raise ConfigError(f"{where}.{slot}: expected {{ClassName: {{kwargs}}}}, got {spec!r}")
    return {
        "trials": trials,
        "sampler": section.get("sampler", DEFAULT_SAMPLER),
        "pruner": section.get("pruner", DEFAULT_PRUNER),
        "space": params,
    }


def method_space(config: Mapping, method: str, require: bool = True) -> dict[str, Param]:
    """The checked space of one method's (expanded) config: every key path must exist in it.

    Raises :class:`ConfigError` naming the method and the key; with ``require`` an empty space is
    an error too (tuning a method needs at least one dimension; ``pml-rank check`` does not
    require one).
    """
    where = f"method {method!r}: tune.space"
    params = tune_section(config, f"method {method!r}: tune")["space"]
    if not params and require:
        raise ConfigError(f"{where}: empty; give at least one key path to tune")
    bare = strip_tune(config)
    for path in params:
        if path.split(".")[0] in UNTUNABLE:
            raise ConfigError(
                f"{where}.{path}: keys under {'/'.join(UNTUNABLE)} cannot be tuned (they change "
                "which classes are validated or what is evaluated, so trials would not be "
                "comparable and the final config would test on classes tuning validated on)"
            )
        if not _leaf_exists(bare, path.split(".")):
            raise ConfigError(
                f"{where}.{path}: no such key in the method's config (key paths are --set "
                "paths, e.g. loss_funcs.metric_loss.num_bins or optimizers.trunk_optimizer.lr)"
            )
    return params


def strip_tune(config: Mapping) -> dict:
    """A deep copy of ``config`` without its ``tune`` section (what a trial run trains)."""
    return {k: copy.deepcopy(v) for k, v in config.items() if k != "tune"}


def apply_params(config: Mapping, params: Mapping[str, Any]) -> dict:
    """``config`` (without ``tune``) with every ``path -> value`` of ``params`` set."""
    out = strip_tune(config)
    for path, value in params.items():
        apply_set(out, path.split("."), copy.deepcopy(value))
    return out


def trial_config(config: Mapping, params: Mapping[str, Any], name: str) -> dict:
    """The run config of one tuning trial: ``params`` set (:func:`apply_params`), no test
    splits (tuning must not see them: ``eval.test`` emptied, ``eval.revisited`` removed), named
    ``name``."""
    cfg = apply_params(config, params)
    ev = cfg.setdefault("eval", {})
    ev["test"] = []
    ev.pop("revisited", None)
    cfg["name"] = name
    return cfg


def optuna_object(spec: Any, module: Any, where: str) -> Any:
    """``{ClassName: kwargs}`` (or ``None``) -> an instance of ``module.ClassName``, for the
    ``tune.sampler`` (``optuna.samplers``) and ``tune.pruner`` (``optuna.pruners``) slots only."""
    if spec is None:
        return None
    name, kwargs = (spec, {}) if isinstance(spec, str) else next(iter(spec.items()))
    cls = getattr(module, str(name), None)
    public = str(name)[:1].isupper() and not str(name).startswith(("Base", "_"))
    if not isinstance(cls, type) or not public or not isinstance(kwargs or {}, Mapping):
        names = sorted(n for n in dir(module) if n[0].isupper() and not n.startswith("Base"))
        raise ConfigError(f"{where}: {name!r} is not one of {module.__name__}: {names}")
    try:  # a keyword of the wrong type (gamma: x) builds, and only fails every trial: refuse it
        registry.check_keywords(cls, dict(kwargs or {}), where, str(name))
        return cls(**(kwargs or {}))
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {name}: {e}") from e


def check_tune_config(config: Mapping, method: str, require: bool = True) -> dict[str, Param]:
    """Everything ``tune`` needs from one method's config, checked: the space (key paths that
    exist; non-empty with ``require``), the trial count, the sampler and the pruner. Returns the
    space. Optuna is imported here and in ``dry_run``, not at module level: every run imports
    this module, few tune."""
    import optuna

    space = method_space(config, method, require)
    section = tune_section(config, f"method {method!r}: tune")
    where = f"method {method!r}: tune"
    sampler = optuna_object(section["sampler"], optuna.samplers, f"{where}.sampler")
    pruner = optuna_object(section["pruner"], optuna.pruners, f"{where}.pruner")
    if space:
        dry_run(sampler, pruner, space, where)
    return space


def dry_run(sampler: Any, pruner: Any, space: Mapping[str, Param], where: str) -> None:
    """Ask and prune two trials of an in-memory study with this sampler and pruner, so a value
    the constructor accepts but sampling cannot use is found before any trial trains."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
            for _ in range(2):
                trial = study.ask()
                values = {p.path: suggest(trial, p) for p in space.values()}
                trial.report(0.5, 1)
                trial.should_prune()
                try:
                    study.tell(trial, 0.5 if values is not None else None)
                except RuntimeError as e:  # grid/brute force: the space is exhausted, fine
                    if "Study.stop" not in str(e):
                        raise
                    break
        except Exception as e:  # noqa: BLE001 -- Optuna raises many kinds for a bad sampler
            raise ConfigError(
                f"{where}.sampler/pruner: cannot sample the space: {type(e).__name__}: {e}"
            ) from e


def suggest(trial: Any, p: Param) -> Any:
    """Draw ``p`` from an Optuna ``trial`` (the parameter is named by its key path)."""
    if p.kind == "int":
        return trial.suggest_int(p.path, p.low, p.high, log=p.log)
    if p.kind == "float":
        return trial.suggest_float(p.path, p.low, p.high, log=p.log)
    return trial.suggest_categorical(p.path, list(p.choices))
