"""Methods of a comparison: ``{method name: config}`` from YAML files or dicts, and their checks.

A config file holds one method, or several under ``methods:`` (each merged over the shared
top-level keys, see :func:`.schema.expand_methods`). :func:`collect_methods` applies ``--set``
overrides and selects ``--methods``; :func:`check_methods` builds every method's models, losses
and miners on the CPU before anything trains, so a config mistake stops a comparison at once.
:func:`slug` gives a method's folder name.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from . import builder
from .schema import ConfigError, apply_set, expand_methods, load_config, parse_set, validate


def slug(name: str) -> str:
    """The folder name of method ``name``: runs of other characters become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_") or "method"


def check_folders(names: Iterable[str]) -> None:
    """Raise :class:`ConfigError` when two method names map to one run folder (:func:`slug`).

    ``"FastAP a"`` and ``"FastAP_a"`` would both train into ``FastAP_a/``: the second run would be
    refused or, resumed, report the first one's numbers.
    """
    seen: dict[str, str] = {}
    for name in names:
        folder = slug(name)
        if folder in seen:
            raise ConfigError(
                f"methods {seen[folder]!r} and {name!r} both map to the run folder {folder!r} "
                "(folder names keep only letters, digits and _.+-): rename one of them"
            )
        seen[folder] = name


def collect_methods(
    configs: Sequence[str | Path | Mapping],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    data_root: str | None = None,
) -> dict[str, dict]:
    """``{method name: config}`` over all configs (``methods`` filters by name, in order).

    Each item of ``configs`` is a YAML path or a config dict (the content a YAML file would have,
    ``methods:`` included). Only the selected methods are validated, so a subset runs even where
    another method names a class that is not installed. ``data_root`` (``--data-root``) becomes
    every config's ``data_root`` unless an override sets ``data_root`` itself. Selected methods
    whose names map to one run folder raise :class:`ConfigError` (:func:`check_folders`).
    """
    if isinstance(configs, (str, Path, Mapping)):
        configs = [configs]
    out: dict[str, dict] = {}
    overrides = list(overrides)
    sets = parse_set(overrides)
    root_set = any(path == ["data_root"] for path, _ in sets)
    for i, item in enumerate(configs):
        if isinstance(item, Mapping):
            where = f"config dict #{i}"
            expanded = expand_methods(copy.deepcopy(dict(item)), default_name=f"config{i}")
            for cfg in expanded.values():
                for p, v in sets:
                    apply_set(cfg, p, copy.deepcopy(v))
        else:
            where = str(item)
            expanded = load_config(item, overrides, check=False)
        for name, cfg in expanded.items():
            if data_root is not None and not root_set:
                cfg["data_root"] = str(data_root)
            if name in out:
                raise ValueError(f"method {name!r} defined twice (in {where})")
            out[name] = cfg
    if methods:
        missing = [m for m in methods if m not in out]
        if missing:
            raise ValueError(f"--methods: unknown {missing}; have {list(out)}")
        out = {m: out[m] for m in methods}
    check_folders(out)
    for cfg in out.values():
        validate(cfg)
    return out


def check_methods(configs: Mapping[str, dict]) -> None:
    """Fail fast: validate every config and construct its models, losses and miners on the CPU.

    Raises :class:`ConfigError` naming the method for any error a constructor raises (a bad
    ``num_bins``, a missing file named in a model...), before any run starts. Datasets are not
    built here (too slow); their class and keywords are checked by :func:`validate`.
    """
    for name, cfg in configs.items():
        validate(cfg)
        try:
            builder.build_models(cfg, torch.device("cpu"))
            builder.build_losses_and_miners(cfg, torch.device("cpu"))
        except ConfigError as e:
            raise ConfigError(f"method {name!r}: {e}") from e
        except (TypeError, ValueError, KeyError, OSError) as e:
            raise ConfigError(f"method {name!r}: {type(e).__name__}: {e}") from e
