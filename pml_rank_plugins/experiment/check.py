"""``pml-rank check``: build every object of every method of a config without training.

For each method: the datasets of every split (sizes and class counts; every fold for the MLRC
protocol; query/database of every ``eval.revisited`` set), the transforms, the models (parameter
counts), losses, miners, sampler, optimizers, lr schedulers, the trainer and the tester. One
summary line per method; any config mistake raises the same error training would (a
:class:`~pml_rank_plugins.experiment.schema.ConfigError`, an unknown name, a bad keyword, a missing
data folder or weights file), which the CLI prints with exit code 2.

Cost: reading the annotation files, instantiating the models and opening every image file's
header (:mod:`.data_scan`: an unreadable image is an error naming it, a file the data does not use
a ``  data:`` line; no image is decoded, no batch is run). What the sampler never samples (the
categories ``CategoryHardSampler`` excludes, single-item classes) is in the ``sampler[...]`` field
with the fix. Models are built on the CPU unless ``device`` says otherwise.
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from . import builder
from .data_scan import DataScan, base_datasets
from .datasets import build_splits
from .methods import collect_methods
from .revisited import build_revisited, revisited_entries
from .schema import spec_name_and_kwargs
from .search_space import check_tune_config
from .space_values import check_space_values
from .spec import RunSpec


def _short(obj) -> str:
    """Class name, ``plugin:``-prefixed for this plugin's classes (FastAPLoss exists in both)."""
    cls = type(obj)
    own = cls.__module__.startswith("pml_rank_plugins")
    return f"plugin:{cls.__name__}" if own else cls.__name__


def _size(dataset) -> str:
    labels = np.asarray(getattr(dataset, "labels", np.zeros((0, 2))))
    classes = len(np.unique(labels[:, 0])) if labels.ndim == 2 and len(labels) else 0
    return f"{len(dataset)}/{classes}c"


def _params(model: torch.nn.Module) -> str:
    n = sum(p.numel() for p in model.parameters())
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return str(n)


def _optimizer_text(key: str, opt) -> str:
    lrs = sorted({g["lr"] for g in opt.param_groups})
    return f"{key.removesuffix('_optimizer')}:{_short(opt)}(lr={','.join(f'{x:g}' for x in lrs)})"


def _transforms_text(config: dict) -> str:
    spec = config.get("transforms")
    if not spec:
        return "built-in"
    parts = []
    for kind in ("train", "eval"):
        items = spec.get(kind, spec.get("eval")) or []
        names = [spec_name_and_kwargs(t, f"transforms.{kind}")[0] for t in items]
        parts.append(f"{kind}=[{','.join(names)}]")
    return " ".join(parts)


# The samplers' warnings for what they exclude: check reports them in the sampler[...] field
_EXCLUDED_WARNINGS = r"\S+ .* excluded: it |\d+ class\(es\) have a single item"


def _sampler_text(sampler, category_names=None) -> str:
    """``plugin:CategoryHardSampler``, with what it never samples and the fix when it excludes
    something (the ``excluded`` and ``candidates`` of
    :class:`~pml_rank_plugins.samplers.base.ClassBatchSampler`); ``category_names``: the train
    dataset's, to name an excluded category id."""
    if sampler is None:
        return "-"
    text = _short(sampler)
    excluded = list(getattr(sampler, "excluded", None) or [])
    if not excluded:
        return text
    parts = []
    for what in dict.fromkeys(w for w, _, _ in excluded if w != "class"):
        pools = [(k, why) for w, k, why in excluded if w == what]
        total = getattr(sampler, "candidates", {}).get(what, len(pools))
        listed = "; ".join(
            f"{_named(k, what, category_names)} {why}" for k, why in pools[:SHOWN_POOLS]
        )
        listed += f"; ... {len(pools) - SHOWN_POOLS} more" if len(pools) > SHOWN_POOLS else ""
        size = getattr(sampler, "part_size", getattr(sampler, "batch_size", None))
        fix = f"fix: a smaller batch_size (now {sampler.batch_size}; each {what} fills {size})"
        if getattr(sampler, "categories_per_batch", None) is not None:
            fix += f", more categories_per_batch (now {sampler.categories_per_batch})"
        if getattr(sampler, "samples_per_class", "all") != "all":
            fix += f", samples_per_class: all (now {sampler.samples_per_class})"
        plural = "categories" if what == "category" else f"{what}s"
        parts.append(f"excludes {len(pools)} of {total} {plural} ({listed}); {fix}, or more items")
    for what, count, why in excluded:
        if what == "class":
            parts.append(f"{count} class(es) {why}; fix: 2+ items in each")
    return f"{text}: " + " | ".join(parts)


SHOWN_POOLS = 8  # excluded categories named in the summary line; the rest are counted


def _named(key, what: str, names) -> str:
    """``2 ('c')``: a category id with its name when the dataset has ``category_names``."""
    if what == "category" and isinstance(key, int) and names is not None and 0 <= key < len(names):
        return f"{key} ({names[key]!r})"
    return str(key)


def check_method(
    name: str,
    config: RunSpec | Mapping,
    device: str | None = None,
    scan: DataScan | None = None,
) -> str:
    """Build everything of one method (a spec, or a config mapping parsed here); return its
    summary line (followed by ``  data: PATH: reason`` lines for the files the data does not use).

    ``scan``: also read every image file's header (:mod:`.data_scan`; an unreadable one raises
    :class:`~.data_scan.DataScanError` naming them all); None: no scan.
    """
    dev = device or "cpu"
    spec = RunSpec.of(config)
    all_folds = spec.protocol.all_folds
    run = spec.fold(0) if all_folds else spec
    cfg = run.config
    # the method itself first: its own mistakes are named as such, not blamed on the space
    with warnings.catch_warnings():  # the sampler's exclusions go into the summary line instead
        warnings.filterwarnings("ignore", _EXCLUDED_WARNINGS, UserWarning)
        exp = builder.build_experiment(run, dev)
    builder.build_tester(run, exp.device)
    builder.make_trainer(exp)
    if spec.get("tune"):  # the search space and budget `pml-rank tune` would use
        check_tune_config(spec.config, name, require=False)
        check_space_values(spec.config, name, exp.datasets["train"])
    if all_folds:
        folds = [exp.datasets] + [
            build_splits(spec.fold(k), exp.seed) for k in range(1, spec.protocol.num_folds)
        ]
        data = (
            f"MLRC {len(folds)} folds: "
            + " | ".join(f"train {_size(f['train'])} val {_size(f['val'])}" for f in folds)
            + " | "
            + " ".join(
                f"{s} {_size(d)}" for s, d in exp.datasets.items() if s not in ("train", "val")
            )
        )
    else:
        data = " ".join(f"{s} {_size(d)}" for s, d in exp.datasets.items())
    scanned = list(exp.datasets.values())
    for entry in revisited_entries(cfg):
        query, database = build_revisited(cfg, entry)
        data += f" {entry['name']} q={len(query)} db={len(database)}"
        scanned += [query, database]
    files, notes = scan.report(scanned) if scan is not None else ("-", [])
    models = " ".join(f"{k}={type(m).__name__}({_params(m)})" for k, m in exp.models.items())
    losses = " ".join(f"{k}={_short(v)}" for k, v in exp.loss_funcs.items())
    miners = " ".join(f"{k}={_short(v)}" for k, v in exp.mining_funcs.items()) or "-"
    optims = " ".join(_optimizer_text(k, o) for k, o in exp.optimizers.items()) or "-"
    scheds = " ".join(f"{k}={_short(v)}" for k, v in exp.lr_schedulers.items()) or "-"
    train_base = base_datasets([exp.datasets["train"]])[0] if "train" in exp.datasets else None
    sampler = _sampler_text(exp.sampler, getattr(train_base, "category_names", None))
    tester = spec_name_and_kwargs(run.eval.tester or "GlobalEmbeddingSpaceTester", "eval.tester")[0]
    line = (
        f"{name}: data[{data}] transforms[{_transforms_text(cfg)}] models[{models}] "
        f"loss[{losses}] miners[{miners}] sampler[{sampler}] optim[{optims}] sched[{scheds}] "
        f"trainer[{exp.trainer_cls.__name__} batch={exp.trainer_kwargs.get('batch_size')} "
        f"epochs={exp.num_epochs}] tester[{tester}]"
    )
    if scan is not None:
        line += f" files[{files}]"
    return "\n".join([line, *(f"  data: {note}" for note in notes)])


def check_configs(
    config_paths: Sequence[str],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    device: str | None = None,
    data_root: str | None = None,
    before: Callable[[dict[str, RunSpec]], None] | None = None,
    scan: bool | None = True,
) -> list[str]:
    """``== path`` then one summary line per method, for every config file (raises on the first
    broken method). Dataset sizes read ``items/classes c``. ``data_root``: as in
    :func:`~pml_rank_plugins.experiment.collect_methods`. ``before``: called with each file's
    selected specs before anything is built (the CLI's device check, the one ``train`` applies).
    ``scan``: True reads every image file's header (:mod:`.data_scan`, once per dataset), False
    (``--no-scan``) reports only what needs no file opened, None no data scan at all."""
    lines = []
    data_scan = None if scan is None else DataScan(headers=bool(scan))
    for path in config_paths:
        lines.append(f"== {path}")
        selected = collect_methods([path], overrides, None, data_root)
        if methods:
            selected = {m: c for m, c in selected.items() if m in methods}
        if before is not None:
            before(selected)
        for name, cfg in selected.items():
            lines.extend(check_method(name, cfg, device, data_scan).split("\n"))
    return lines
