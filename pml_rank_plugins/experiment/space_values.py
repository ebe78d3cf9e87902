"""Search spaces checked value by value, before any trial (``pml-rank check`` and ``tune``).

A space whose every value the class refuses (``num_bins: {int: [0, 0]}``, a negative learning
rate, ``batch_size: {choice: ["64"]}``) would otherwise pass ``check``, and ``tune`` would train
nothing but failing trials. :func:`check_space_values` sets each dimension, one at a time, to
its bounds (and, for a range, its midpoint) or to each of its choices, validates that config
(:func:`~pml_rank_plugins.experiment.validate`) and builds what the value reaches: the models,
losses, miners, optimizers and lr schedulers, on the CPU, and the sampler (on the method's train
split) when the value changes the sampler or the trainer; no batch is run.

Cost: per dimension 3 values (a range) or one per choice, each a model + loss construction; the
train split is read once per method, and only when a dimension reaches the sampler or trainer.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from . import builder
from .datasets import build_splits
from .schema import ConfigError, spec_name_and_kwargs, validate
from .search_space import Param, apply_params, method_space
from .values import seed_of

# The sections a sampler is built from (its spec; the trainer's batch_size).
SAMPLER_INPUTS = ("sampler", "trainer")


def probe_values(param: Param) -> list[Any]:
    """The values a dimension is checked at: its choices, or low, middle and high."""
    if param.kind == "choice":
        return list(param.choices)
    if param.kind == "int":
        return sorted({param.low, (param.low + param.high) // 2, param.high})
    return sorted({param.low, (param.low + param.high) / 2, param.high})


def _sampler_inputs(config: Mapping) -> tuple[Any, int]:
    """The train split and seed a probed sampler is built on (the method's own data)."""
    seed = seed_of(dict(config))
    datasets = build_splits(config, seed)
    if "train" not in datasets:
        raise ConfigError(f"split: one split must be named 'train' (have {sorted(datasets)})")
    return datasets["train"], seed


def _build(cfg: dict, config: Mapping, cache: dict, train_set: Any = None) -> None:
    """Build what ``cfg`` (``config`` with one value set) reaches; ``cache`` keeps the models of
    ``config`` and its train split, built once."""
    cpu = torch.device("cpu")
    same = cfg["models"] == config["models"] and cfg.get("data_root") == config.get("data_root")
    if not same:
        models = builder.build_models(cfg, cpu)
    else:
        if "models" not in cache:
            cache["models"] = builder.build_models(cfg, cpu)
        models = cache["models"]
    losses, _ = builder.build_losses_and_miners(cfg, cpu)
    optimizers = builder.build_optimizers(cfg, models, losses)
    builder.build_lr_schedulers(cfg, optimizers)
    if cfg.get("sampler") and any(cfg.get(k) != config.get(k) for k in SAMPLER_INPUTS):
        if "train" not in cache:
            cache["train"] = (train_set, seed_of(dict(config)))
            if train_set is None:
                cache["train"] = _sampler_inputs(config)
        train, seed = cache["train"]
        _, tkwargs = spec_name_and_kwargs(cfg["trainer"], "trainer")
        builder.build_sampler(cfg, train, int(tkwargs["batch_size"]), seed)


def check_space_values(config: Mapping, method: str, train_set: Any = None) -> None:
    """Raise :class:`ConfigError` naming the method, the key and the value when a value of the
    method's ``tune.space`` makes a config that does not validate or build.

    The method's own config is built first: a mistake outside the space (``betas: [0.9]``) is
    reported as itself (the builder's error names its key), not blamed on the first value of
    the space. The models are built once per method and shared by every probed value that leaves
    the ``models`` section (and the data root of weight files) as it is: building a trunk is most
    of a probe's cost, and the optimizers and schedulers built over them are thrown away. A value
    that changes the ``sampler`` or the trainer (its ``batch_size``) builds the sampler on the
    method's train split (``train_set``, else built here once), so a space in which a class
    contributes a single item per batch (``samples_per_class: {int: [1, 1]}``: no query has a
    positive) is refused by the sampler itself, as training would refuse it."""
    params = method_space(config, method, require=False)
    if not params:
        return
    cache: dict = {}
    bare = apply_params(config, {})
    try:
        _build(bare, bare, cache, train_set)
    except Exception as e:  # noqa: BLE001 -- the method's own mistake, named by the builder
        kind = "" if isinstance(e, ConfigError) else f"{type(e).__name__}: "
        raise ConfigError(f"method {method!r}: {kind}{e}") from e
    for path, param in params.items():
        for value in probe_values(param):
            cfg = apply_params(config, {path: value})
            try:
                validate(cfg)
                _build(cfg, bare, cache, train_set)
            except Exception as e:  # noqa: BLE001 -- any refusal of the value is the answer
                raise ConfigError(
                    f"method {method!r}: tune.space.{path} ({param.describe()}): the value "
                    f"{value!r} is refused: {type(e).__name__}: {e}"
                ) from e
