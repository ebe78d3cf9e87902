"""Methods of a comparison: ``{method name: RunSpec}`` from YAML files or dicts, and their checks.

A config file holds one method, or several under ``methods:`` (each merged over the shared
top-level keys, see :func:`.schema.expand_methods`). :func:`collect_methods` applies ``--set``
overrides, selects ``--methods`` and parses each selected method once into a
:class:`~pml_rank_plugins.experiment.RunSpec` (the boundary: nothing below validates again);
:func:`check_methods` builds every method's models, losses and miners on the CPU before anything
trains, so a config mistake stops a comparison at once. :func:`slug` gives a method's folder name;
``check_folders`` refuses names that are no safe folder name (``..``, ``a/b``, control characters)
or share one folder, so every run stays inside ``--out``.
"""

from __future__ import annotations

import copy
import json
import re
import unicodedata
import weakref
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from . import builder, schema
from .schema import ConfigError, apply_set, expand_methods, parse_set
from .search_space import tune_section
from .spec import RunSpec
from .values import check_data_root

# Characters a folder name keeps; every run of other characters becomes one ``_``.
_FOLDER_CHARS = r"A-Za-z0-9_.+-"


def slug(name: str) -> str:
    """The folder name of method ``name``: runs of other characters become ``_``.

    Never ``""``, ``"."``, ``".."`` or another name of dots only (a folder that is not one, or is
    the parent): those become ``"method"`` (``check_folders`` refuses such method names
    before any folder is made; the fallback keeps file names like ``importance_<slug>.png`` safe).
    """
    folder = re.sub(f"[^{_FOLDER_CHARS}]+", "_", name).strip("_")
    return folder if folder.strip(".") else "method"


def folder_problem(name: str, strict: bool = True) -> str | None:
    """Why ``name`` cannot name a run folder, or ``None`` when it can.

    Refused: names that are empty or dots only once slugged (``""``, ``"."``, ``".."``,
    ``" .. "``, ``".._"``, ``"..\\x00"``: they would name ``--out`` itself or its parent); with
    ``strict`` also names whose folder would be hidden (a leading ``.``; ``summarize_dir`` skips
    hidden folders), path separators (``/``, ``\\``) and control characters.
    """
    raw = re.sub(f"[^{_FOLDER_CHARS}]+", "_", name).strip("_")
    if not raw.strip("."):
        what = "empty" if not raw else "dots only ('.' and '..' are --out itself and its parent)"
        return f"its folder name would be {raw!r}: {what}"
    if not strict:
        return None
    if "/" in name or "\\" in name:
        return "it holds a path separator (/ or \\)"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "it holds a control character"
    if raw.startswith("."):
        return f"its folder {raw!r} would be hidden (it starts with '.')"
    return None


def _suggestion(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_+-]+", "_", name).strip("_") or "method1"


def check_folders(names: Iterable[str], kind: str = "method", strict: bool = True) -> None:
    """Raise :class:`ConfigError` naming the method when its name cannot be a run folder name.

    Every name must be safe (:func:`folder_problem`: ``..``, ``a/b`` or a control character would
    put runs outside ``--out`` or nowhere sensible), and no two names may map to one run folder
    (:func:`slug`): ``"FastAP a"`` and ``"FastAP_a"`` would both train into ``FastAP_a/``, the
    second run refused or, resumed, reporting the first one's numbers; names differing in case
    only (``"A"``, ``"a"``) share a folder on case-insensitive file systems (macOS, Windows).

    Args:
        names: method names, or other names of runs (sweep cells) with ``strict=False``.
        kind: the word naming them in the message.
        strict: refuse every :func:`folder_problem`; ``False`` refuses only names whose folder
            is not one (empty or dots only) and collisions: a sweep cell ``path=a/b`` is a
            value, not a path, and :func:`slug` makes it ``path_a_b``.

    Complexity: O(total length of the names).
    """
    seen: dict[str, str] = {}
    for name in names:
        problem = folder_problem(name, strict)
        if problem is not None:
            raise ConfigError(
                f"{kind} {name!r}: not a safe run folder name: {problem}; rename it with "
                f"letters, digits and _.+- (e.g. {_suggestion(name)!r})"
            )
        folder = slug(name)
        other = seen.get(folder.casefold())
        if other is not None:
            where = (
                f"the run folder {folder!r}"
                if slug(other) == folder
                else f"the run folders {slug(other)!r} and {folder!r}, one folder where case is "
                "ignored (macOS, Windows)"
            )
            raise ConfigError(
                f"{kind}s {other!r} and {name!r} both map to {where} (folder names keep only "
                "letters, digits and _.+-): rename one of them"
            )
        seen[folder.casefold()] = name


def collect_methods(
    configs: Sequence[str | Path | Mapping],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    data_root: str | None = None,
) -> dict[str, RunSpec]:
    """``{method name: spec}`` over all configs (``methods`` filters by name, in order).

    Each item of ``configs`` is a YAML path (read once) or a config dict (the content a YAML file
    would have, ``methods:`` included). Only the selected methods are validated (once each, by
    :meth:`~pml_rank_plugins.experiment.RunSpec.parse`), so a subset runs even where another method
    names a class that is not installed. A spec reads like its config (it is a ``Mapping``).
    ``data_root`` (``--data-root``) becomes every config's ``data_root`` unless an override sets
    ``data_root`` itself. Selected methods whose names are no safe folder name or map to one run
    folder raise :class:`ConfigError` (``check_folders``).
    """
    if isinstance(configs, (str, Path, Mapping)):
        configs = [configs]
    out: dict[str, dict] = {}
    overrides = list(overrides)
    sets = parse_set(overrides)
    root_set = any(path == ["data_root"] for path, _ in sets)
    for i, item in enumerate(configs):
        if isinstance(item, Mapping):
            where, raw, stem = f"config dict #{i}", copy.deepcopy(dict(item)), f"config{i}"
        else:
            where, raw, stem = str(item), schema.load_yaml(item), Path(item).stem
        expanded = expand_methods(raw, default_name=stem)
        check_shared_tune(raw)
        for cfg in expanded.values():
            for p, v in sets:
                apply_set(cfg, p, copy.deepcopy(v))
        for name, cfg in expanded.items():
            if data_root is not None and not root_set:
                # The file's own value is still checked: a nonsense data_root (5, [1], true) is
                # refused even where --data-root / $PML_RANK_DATA replaces it.
                check_data_root(cfg.get("data_root"))
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
    specs = {name: RunSpec.parse(cfg) for name, cfg in out.items()}
    for name, spec in specs.items():  # train/compare/sweep refuse a malformed tune, as tune does
        tune_section(spec.config, f"method {name!r}: tune")
    return specs


def check_shared_tune(raw: Mapping) -> None:
    """The top-level ``tune`` section of a file with ``methods:``, checked as a section of its
    own (:func:`~pml_rank_plugins.experiment.search_space.tune_section`: keys, trials, every
    space entry, the sampler/pruner form), so a part every method overrides (``space: x`` beside
    each method's own space) is refused rather than silently ignored."""
    if isinstance(raw, Mapping) and raw.get("methods") and raw.get("tune") is not None:
        tune_section(raw, "tune")


def collected(configs: object) -> bool:
    """True for a non-empty ``{method: RunSpec}`` (what :func:`collect_methods` returns), so a
    caller handed the CLI's specs does not collect (read, override, validate) them again."""
    return (
        isinstance(configs, Mapping)
        and not isinstance(configs, RunSpec)
        and bool(configs)
        and all(isinstance(v, RunSpec) for v in configs.values())
    )


# Specs whose objects check_methods built already (a CLI check and the comparison's own).
_CHECKED: weakref.WeakSet = weakref.WeakSet()


def _models_key(spec: RunSpec) -> str:
    return json.dumps([spec.get("models"), spec.data_root], sort_keys=True, default=str)


def check_methods(configs: Mapping[str, RunSpec | Mapping]) -> None:
    """Fail fast: construct every method's models, losses and miners on the CPU.

    ``configs``: specs (:func:`collect_methods`) or config mappings (validated here). Raises
    :class:`ConfigError` naming the method for any error a constructor raises (a bad
    ``num_bins``, a missing file named in a model...), before any run starts. Datasets are not
    built here (too slow); their class and keywords are checked by
    :func:`~pml_rank_plugins.experiment.validate`. A spec is checked once (a second call skips it),
    and methods sharing one ``models`` section (and data root) build those models once: the same
    section builds the same way.
    """
    built_models: set[str] = set()
    for name, cfg in configs.items():
        spec = RunSpec.of(cfg)
        if spec in _CHECKED:
            continue
        key = _models_key(spec)
        try:
            if key not in built_models:
                builder.build_models(spec.config, torch.device("cpu"))
                built_models.add(key)
            builder.build_losses_and_miners(spec.config, torch.device("cpu"))
        except ConfigError as e:
            raise ConfigError(f"method {name!r}: {e}") from e
        except (TypeError, ValueError, KeyError, OSError) as e:
            raise ConfigError(f"method {name!r}: {type(e).__name__}: {e}") from e
        _CHECKED.add(spec)
