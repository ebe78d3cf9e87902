"""``pml-rank check``: build every object of every method of a config without training.

For each method: the datasets of every split (sizes and class counts; every fold for the MLRC
protocol; query/database of every ``eval.revisited`` set), the transforms, the models (parameter
counts), losses, miners, sampler, optimizers, lr schedulers, the trainer and the tester. One
summary line per method; any config mistake raises the same error training would (a
:class:`~pml_rank_plugins.experiment.schema.ConfigError`, an unknown name, a bad keyword, a missing
data folder or weights file), which the CLI prints with exit code 2.

Cost: reading the annotation files and instantiating the models (no image is decoded, no batch
is run). Models are built on the CPU unless ``device`` says otherwise.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from . import builder
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


def check_method(name: str, config: RunSpec | Mapping, device: str | None = None) -> str:
    """Build everything of one method (a spec, or a config mapping parsed here); return its
    summary line."""
    dev = device or "cpu"
    spec = RunSpec.of(config)
    all_folds = spec.protocol.all_folds
    run = spec.fold(0) if all_folds else spec
    cfg = run.config
    # the method itself first: its own mistakes are named as such, not blamed on the space
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
    for entry in revisited_entries(cfg):
        query, database = build_revisited(cfg, entry)
        data += f" {entry['name']} q={len(query)} db={len(database)}"
    models = " ".join(f"{k}={type(m).__name__}({_params(m)})" for k, m in exp.models.items())
    losses = " ".join(f"{k}={_short(v)}" for k, v in exp.loss_funcs.items())
    miners = " ".join(f"{k}={_short(v)}" for k, v in exp.mining_funcs.items()) or "-"
    optims = " ".join(_optimizer_text(k, o) for k, o in exp.optimizers.items()) or "-"
    scheds = " ".join(f"{k}={_short(v)}" for k, v in exp.lr_schedulers.items()) or "-"
    sampler = _short(exp.sampler) if exp.sampler is not None else "-"
    tester = spec_name_and_kwargs(run.eval.tester or "GlobalEmbeddingSpaceTester", "eval.tester")[0]
    return (
        f"{name}: data[{data}] transforms[{_transforms_text(cfg)}] models[{models}] "
        f"loss[{losses}] miners[{miners}] sampler[{sampler}] optim[{optims}] sched[{scheds}] "
        f"trainer[{exp.trainer_cls.__name__} batch={exp.trainer_kwargs.get('batch_size')} "
        f"epochs={exp.num_epochs}] tester[{tester}]"
    )


def check_configs(
    config_paths: Sequence[str],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    device: str | None = None,
    data_root: str | None = None,
    before: Callable[[dict[str, RunSpec]], None] | None = None,
) -> list[str]:
    """``== path`` then one summary line per method, for every config file (raises on the first
    broken method). Dataset sizes read ``items/classes c``. ``data_root``: as in
    :func:`~pml_rank_plugins.experiment.collect_methods`. ``before``: called with each file's
    selected specs before anything is built (the CLI's device check, the one ``train`` applies)."""
    lines = []
    for path in config_paths:
        lines.append(f"== {path}")
        selected = collect_methods([path], overrides, None, data_root)
        if methods:
            selected = {m: c for m, c in selected.items() if m in methods}
        if before is not None:
            before(selected)
        lines.extend(check_method(name, cfg, device) for name, cfg in selected.items())
    return lines
