"""What every ``pml-rank`` command is (:class:`Command`) and the steps commands share: config
mistakes as exit status 2 (:class:`BadConfig`, :func:`load`, :func:`argument`), config paths and
the data root, device checks, and the failed-runs report.

Only the standard library at module level: the table of commands is imported to build the parser,
and ``--help`` must not import torch, PML, scipy or matplotlib; each helper imports the
subpackage it needs when it runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar

from .options import DEVICE_FORMS, compile_overrides

__all__ = [
    "BadArgument",
    "BadConfig",
    "Command",
    "argument",
    "check_config_devices",
    "check_device",
    "config_paths",
    "data_root",
    "load",
    "methods",
    "pick",
    "report_failures",
]


class Command:
    """One ``pml-rank`` subcommand: its name and help line, its options and its action.

    A subclass sets :attr:`name` and :attr:`help` (the line ``pml-rank --help`` shows; it holds an
    example), declares its options in :meth:`add_arguments` and acts on them in :meth:`run`;
    ``pml_rank_plugins.commands.COMMANDS`` lists the subclasses in the order ``--help`` shows.
    """

    name: ClassVar[str]
    help: ClassVar[str]
    # Reads configs or run folders: ``--allow-module`` applies first, ``--device`` is checked, and
    # config/run errors become one line (exit 2 or 1). ``list`` reads neither.
    loads_configs: ClassVar[bool] = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's arguments on its subparser."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        """Act on the parsed ``args``; return the exit status (0 success, 1 a run failed)."""
        raise NotImplementedError


class BadConfig(Exception):
    """A config mistake found by the CLI: ``pml-rank: config error: ...``, exit status 2."""

    kind = "config error"


class BadArgument(BadConfig):
    """A command-line mistake: ``pml-rank: error: ...``, exit status 2."""

    kind = "error"


def load(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (load/validate configs), config mistakes as :class:`BadConfig`."""
    import yaml

    from ..experiment import ConfigError, UnknownNameError

    try:
        return fn(*args, **kwargs)
    except (ConfigError, UnknownNameError, TypeError, ValueError, OSError, yaml.YAMLError) as e:
        raise BadConfig(str(e)) from e


def argument(
    fn: Callable[..., Any],
    *args: Any,
    errors: tuple[type[BaseException], ...] = (ValueError, OSError),
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``, its ``errors`` (a bad path or run folder) as exit status 2."""
    try:
        return fn(*args, **kwargs)
    except errors as e:
        raise BadArgument(str(e)) from e


def data_root(args: argparse.Namespace, env: bool = True) -> str | None:
    """``--data-root`` (else, with ``env``, ``$PML_RANK_DATA``) as an absolute path, or None."""
    from ..experiment import resolve_data_root

    flag = getattr(args, "data_root", None)
    if flag is not None and not Path(flag).expanduser().is_dir():
        raise BadConfig(f"--data-root {flag}: not a folder")
    if flag is None and not env:
        return None
    return resolve_data_root(flag)


def config_paths(names: list[str]) -> list[Path]:
    """Each CONFIG argument (a file, else a shipped config name) as a path."""
    from ..experiment import resolve_config

    return [load(resolve_config, n) for n in names]


def methods(args: argparse.Namespace) -> list[str] | None:
    """``--methods A,B`` as ``["A", "B"]``; None without it."""
    return [m.strip() for m in args.methods.split(",")] if args.methods else None


def pick(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """``{name: args.name}`` for each of ``names``."""
    return {name: getattr(args, name) for name in names}


def check_device(device: str | None, key: str = "--device") -> None:
    """``--device`` (or a config's ``device``, ``key`` names which) is a device this machine
    has: one line (exit 2) instead of a CUDA traceback deep inside the first run."""
    if device is None:
        return
    if not isinstance(device, str) or not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise BadArgument(f"{key} {device}: not a device; use {DEVICE_FORMS}")
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    available = ["cpu"] + [f"cuda:{i}" for i in range(cuda)]
    available += ["mps"] if torch.backends.mps.is_available() else []
    if ("cuda:0" if device == "cuda" else device) not in available:
        fix = "" if key == "--device" else "; pass --device cpu or change the config"
        raise BadArgument(
            f"{key} {device}: not available here; available: {', '.join(available)}{fix}"
        )


def check_config_devices(args: argparse.Namespace, configs: dict) -> None:
    """Without ``--device``, every selected method's ``device:`` must exist here."""
    if args.device is None:
        for name, cfg in configs.items():
            check_device(cfg.get("device"), f"method {name!r}: device")


def collect_one_config(args: argparse.Namespace) -> tuple[dict, list[str] | None, str | None]:
    """``(configs, names, root)`` of a command on one CONFIG (tune, study): ``--compile`` made
    the first ``--set`` (in ``args.overrides``), the ``--methods`` selected under the data root
    collected and validated once, their devices checked."""
    from ..experiment import collect_methods

    args.overrides = compile_overrides(args)
    (path,) = config_paths([args.config])
    names, root = methods(args), data_root(args)
    configs = load(collect_methods, [path], args.overrides, names, root)
    check_config_devices(args, configs)
    return configs, names, root


def report_failures(summary: dict) -> int:
    """Exit status 1 when any run failed or was refused (the others completed and are in the
    tables); a refused run never started: its folder was in use by another live command."""
    failed = len(summary.get("failed") or [])
    refused = len(summary.get("refused") or [])
    if failed:
        print(f"pml-rank: {failed} run(s) failed; see the table and summary.json", file=sys.stderr)
    if refused:
        print(
            f"pml-rank: {refused} run(s) refused: folder busy (in use by another live command) "
            "or unsafe; nothing was written there; run again with --resume once it is free",
            file=sys.stderr,
        )
    return 1 if failed or refused else 0
