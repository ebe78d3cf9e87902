"""Search spaces checked value by value, before any trial (``pml-rank check`` and ``tune``).

A space whose every value the class refuses (``num_bins: {int: [0, 0]}``, a negative learning
rate, ``batch_size: {choice: ["64"]}``) would otherwise pass ``check``, and ``tune`` would train
nothing but failing trials. :func:`check_space_values` sets each dimension, one at a time, to
its bounds (and, for a range, its midpoint) or to each of its choices, validates that config
(:func:`~pml_rank_plugins.experiment.validate`) and builds what the value reaches: the models,
losses, miners, optimizers and lr schedulers, on the CPU (no dataset is read, no batch is run).

Cost: per dimension 3 values (a range) or one per choice, each a model + loss construction.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from . import builder
from .schema import ConfigError, validate
from .search_space import Param, apply_params, method_space


def probe_values(param: Param) -> list[Any]:
    """The values a dimension is checked at: its choices, or low, middle and high."""
    if param.kind == "choice":
        return list(param.choices)
    if param.kind == "int":
        return sorted({param.low, (param.low + param.high) // 2, param.high})
    return sorted({param.low, (param.low + param.high) / 2, param.high})


def check_space_values(config: Mapping, method: str) -> None:
    """Raise :class:`ConfigError` naming the method, the key and the value when a value of the
    method's ``tune.space`` makes a config that does not validate or build.

    The models are built once per method and shared by every probed value that leaves the
    ``models`` section (and the data root of weight files) as it is: building a trunk is most of
    a probe's cost (a ResNet-50 with its weights file, once per value before), and the
    optimizers and schedulers built over them are thrown away."""
    cpu = torch.device("cpu")
    shared: dict | None = None
    for path, param in method_space(config, method, require=False).items():
        for value in probe_values(param):
            cfg = apply_params(config, {path: value})
            try:
                validate(cfg)
                same = cfg["models"] == config["models"] and cfg.get("data_root") == config.get(
                    "data_root"
                )
                if not same:
                    models = builder.build_models(cfg, cpu)
                else:
                    shared = shared or builder.build_models(cfg, cpu)
                    models = shared
                losses, _ = builder.build_losses_and_miners(cfg, cpu)
                optimizers = builder.build_optimizers(cfg, models, losses)
                builder.build_lr_schedulers(cfg, optimizers)
            except Exception as e:  # noqa: BLE001 -- any refusal of the value is the answer
                raise ConfigError(
                    f"method {method!r}: tune.space.{path} ({param.describe()}): the value "
                    f"{value!r} is refused: {type(e).__name__}: {e}"
                ) from e
