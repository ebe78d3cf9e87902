"""Values the runner reads from a config, checked when the config is checked (``check == train``).

:func:`check_values` (called by :func:`~pml_rank_plugins.experiment.validate`) refuses, naming the
key, every value a run would otherwise fail on after training started or silently misread: integer
sizes and counts go through the one integer validator
(:func:`pml_rank_plugins.functional.validation.check_int`: floats, bools, strings and out-of-range
values refused); ``eval.test_interval >= 1``, ``eval.patience`` null or ``>= 0``;
``eval.pictures`` (known keys, ``num_queries`` and ``k`` in 1..``MAX_PICTURE_ROWS``, ``pdf`` a
boolean); a known ``device``; a ``data_root`` that is a path (a string); finite optimizer and
scheduler numbers. :func:`check_trainer` is also applied by the builder to the trainer keywords it
passes to PML (``dataloader_num_workers`` included), and :func:`check_eval_splits` where the
splits are known.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..functional.validation import check_int
from .compiling import parse_compile
from .errors import ConfigError

# Upper bounds: far above any real run, low enough to catch a unit mistake (1e15 iterations).
MAX_EPOCHS = 1_000_000
MAX_ITERATIONS = 1_000_000_000
MAX_BATCH = 10_000_000
MAX_WORKERS = 1024
MAX_SEED = 2**32 - 1  # numpy's global seed range
DEVICE = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")
EVAL_ENTRY_KEYS = {"query", "reference"}
PICTURE_KEYS = {"num_queries", "k", "pdf"}
MAX_PICTURE_ROWS = 64  # a grid of 64 x 65 tiles is already over 90 inches tall


def integer(value: Any, key: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """:func:`check_int` with a :class:`ConfigError` naming ``key``.

    Args:
        value: the config value.
        key: its dotted config key, e.g. ``trainer.MetricLossOnly.batch_size``.
        minimum: inclusive lower bound, or None.
        maximum: inclusive upper bound, or None.

    Returns:
        The value as a Python int.

    Raises:
        ConfigError: not an integer (floats, bools and strings included) or out of range.
    """
    try:
        return check_int(value, key, minimum, maximum)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def seed_of(config: dict) -> int:
    """The run seed (``seed``, default 0), checked."""
    return integer(config.get("seed", 0), "seed", 0, MAX_SEED)


def check_device(value: Any, key: str = "device") -> str | None:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (None: the default); :class:`ConfigError`
    naming ``key`` otherwise (``tpu``, a mapping...)."""
    if value is None:
        return None
    if not isinstance(value, str) or not DEVICE.match(value):
        raise ConfigError(f"{key}: unknown device {value!r}; use cpu, cuda, cuda:N or mps")
    return value


def check_data_root(value: Any, key: str = "data_root") -> str | None:
    """A folder path (a non-empty string; None: unset), else :class:`ConfigError` naming
    ``key``: ``data_root: 5``, ``[1]``, ``true`` or a mapping would be turned into a folder
    name silently (``str(5)``), or fail only when a relative dataset path is resolved."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        shown = f"{type(value).__name__} {value!r}" if not isinstance(value, str) else repr(value)
        raise ConfigError(
            f"{key}: expected a folder path as a string (e.g. data_root: /data, or --data-root "
            f"/data), got {shown}"
        )
    return value


def check_trainer(name: str, kwargs: dict) -> None:
    """The trainer keywords the runner reads or PML does not validate, keyed ``trainer.NAME.KEY``.

    ``batch_size`` is required; ``num_epochs``, ``iterations_per_epoch`` (null: PML derives
    it), ``dataloader_num_workers``, ``label_hierarchy_level`` and ``compile``
    (:func:`~pml_rank_plugins.experiment.compiling.parse_compile`) are checked when present.
    """
    key = f"trainer.{name}"
    if "batch_size" not in kwargs:
        raise ConfigError(f"{key}.batch_size is required")
    integer(kwargs["batch_size"], f"{key}.batch_size", 1, MAX_BATCH)
    if "num_epochs" in kwargs:
        integer(kwargs["num_epochs"], f"{key}.num_epochs", 1, MAX_EPOCHS)
    if kwargs.get("iterations_per_epoch") is not None:
        integer(kwargs["iterations_per_epoch"], f"{key}.iterations_per_epoch", 1, MAX_ITERATIONS)
    if "dataloader_num_workers" in kwargs:
        integer(kwargs["dataloader_num_workers"], f"{key}.dataloader_num_workers", 0, MAX_WORKERS)
    if "label_hierarchy_level" in kwargs:
        integer(kwargs["label_hierarchy_level"], f"{key}.label_hierarchy_level", 0)
    if "compile" in kwargs:
        parse_compile(kwargs["compile"], f"{key}.compile")


def check_tester(name: str, kwargs: dict) -> None:
    """``eval.tester.NAME.batch_size >= 1`` and ``dataloader_num_workers >= 0`` when given."""
    if "batch_size" in kwargs:
        integer(kwargs["batch_size"], f"eval.tester.{name}.batch_size", 1, MAX_BATCH)
    if "dataloader_num_workers" in kwargs:
        key = f"eval.tester.{name}.dataloader_num_workers"
        integer(kwargs["dataloader_num_workers"], key, 0, MAX_WORKERS)


def _check_finite(value: Any, key: str) -> None:
    """Every number inside ``value`` (nested mappings and lists) is finite."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")


def split_names(value: Any, key: str) -> list[str]:
    """The split names one ``eval.validation``/``eval.test`` entry uses (a name, or
    ``{query: q, reference: r or [r...]}``)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and "query" in value and set(value) <= EVAL_ENTRY_KEYS:
        refs = value.get("reference", value["query"])
        refs = [refs] if isinstance(refs, str) else refs
        names = [value["query"], *(refs if isinstance(refs, list) else [refs])]
        if all(isinstance(n, str) for n in names):
            return names
    raise ConfigError(
        f"{key}: expected a split name or {{query: name, reference: [names]}}, got {value!r}"
    )


def eval_entries(config: dict) -> list[tuple[str, list[str]]]:
    """``(key, split names)`` for every explicitly configured ``eval.validation``/``test`` entry."""
    ev = config.get("eval") or {}
    out = []
    for part in ("validation", "test"):
        entries = ev.get(part)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise ConfigError(f"eval.{part}: expected a list of split names, got {entries!r}")
        for i, e in enumerate(entries):
            out.append((f"eval.{part}[{i}]", split_names(e, f"eval.{part}[{i}]")))
    return out


def check_eval_splits(config: dict, datasets: dict) -> None:
    """Every split an ``eval.validation``/``eval.test`` entry names exists (else training would
    skip that validation silently, or fail only after training)."""
    for key, names in eval_entries(config):
        for n in names:
            if n not in datasets:
                raise ConfigError(f"{key}: split {n!r} does not exist (have {sorted(datasets)})")


def _check_eval(ev: dict) -> None:
    integer(ev.get("test_interval", 1), "eval.test_interval", 1, MAX_EPOCHS)
    if ev.get("patience") is not None:
        integer(ev["patience"], "eval.patience", 0, MAX_EPOCHS)
    ks = ev.get("recall_at_k", [1])
    if not isinstance(ks, list):
        raise ConfigError(f"eval.recall_at_k: expected a list of integers, got {ks!r}")
    for i, k in enumerate(ks):
        integer(k, f"eval.recall_at_k[{i}]", 1)
    metrics = ev.get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise ConfigError(f"eval.metrics: expected a list of metric names, got {metrics!r}")
    k = ev.get("k")
    if k is not None and k != "max_bin_count":
        integer(k, "eval.k", 1)
    if not isinstance(ev.get("primary_metric", ""), str):
        raise ConfigError(
            f"eval.primary_metric: expected a metric name, got {ev['primary_metric']!r}"
        )
    _check_pictures(ev.get("pictures"))


def _check_pictures(pictures: Any) -> None:
    if pictures is None:
        return
    if not isinstance(pictures, dict):
        raise ConfigError(
            f"eval.pictures: expected a mapping like {{num_queries: 8, k: 5, pdf: true}}, "
            f"got {pictures!r}"
        )
    bad = set(pictures) - PICTURE_KEYS
    if bad:
        raise ConfigError(
            f"eval.pictures: unknown key(s) {sorted(map(str, bad))}; allowed: {sorted(PICTURE_KEYS)}"
        )
    for key in ("num_queries", "k"):
        if key in pictures:
            integer(pictures[key], f"eval.pictures.{key}", 1, MAX_PICTURE_ROWS)
    if "pdf" in pictures and not isinstance(pictures["pdf"], bool):
        raise ConfigError(f"eval.pictures.pdf: expected true or false, got {pictures['pdf']!r}")


def check_values(config: dict, tester: tuple[str, dict] | None, trainer: tuple[str, dict]) -> None:
    """Check every value the runner reads (see the module docstring); ``tester``/``trainer`` are
    the ``(name, kwargs)`` of the ``eval.tester`` and ``trainer`` specs.

    Raises:
        ConfigError: naming the first bad key.
    """
    for section in ("models", "loss_funcs", "mining_funcs", "optimizers", "lr_schedulers"):
        if not isinstance(config.get(section) or {}, dict):
            raise ConfigError(f"{section}: expected a mapping {{key: {{ClassName: {{kwargs}}}}}}")
    if "name" in config and not isinstance(config["name"], str):
        raise ConfigError(f"name: expected a string, got {config['name']!r}")
    seed_of(config)
    check_device(config.get("device"))
    check_data_root(config.get("data_root"))
    check_trainer(*trainer)
    split = config.get("split") or {}
    names = split.get("names") if isinstance(split, dict) else None
    if names is not None and (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise ConfigError(f"split.names: expected a list of distinct split names, got {names!r}")
    if isinstance(split, dict) and split.get("fold") is not None:
        integer(split["fold"], "split.fold", 0)
    _check_eval(config.get("eval") or {})
    eval_entries(config)
    if tester is not None:
        check_tester(*tester)
    for section in ("optimizers", "lr_schedulers"):
        _check_finite(config.get(section) or {}, section)
