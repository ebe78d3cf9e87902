"""Configs shipped inside the package (``pml_rank_plugins/experiment/configs/*.yaml``), usable by name.

``pml-rank compare default`` runs ``pml_rank_plugins/experiment/configs/default.yaml`` from any working
directory, also from an installed wheel. A path that exists always wins over a shipped name.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .schema import ConfigError

PACKAGE = "pml_rank_plugins.experiment.configs"


def shipped_configs() -> dict[str, Path]:
    """``{name: path}`` of every shipped config; nested ones are named ``sub/name``."""
    root = resources.files(PACKAGE)
    base = Path(str(root))
    return {p.relative_to(base).with_suffix("").as_posix(): p for p in sorted(base.rglob("*.yaml"))}


def resolve_config(arg: str | Path) -> Path:
    """An existing file ``arg``, else the shipped config named ``arg`` (``.yaml`` optional).

    Raises :class:`ConfigError` listing the shipped names when neither exists.
    """
    path = Path(arg)
    if path.is_file():
        return path
    if path.exists():
        raise ConfigError(f"{arg}: is not a file (give a YAML config or a shipped config name)")
    name = str(arg)[: -len(".yaml")] if str(arg).endswith(".yaml") else str(arg)
    shipped = shipped_configs()
    for candidate in (name, name.removeprefix("configs/")):  # README paths work outside a clone
        if candidate in shipped:
            return shipped[candidate]
    raise ConfigError(
        f"{arg}: no such file and no shipped config of that name; shipped configs: "
        f"{', '.join(shipped) or '(none)'}"
    )
