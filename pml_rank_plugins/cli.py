"""Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins``).

pml-rank [-v] [--debug] [--version] COMMAND ...
pml-rank train CONFIG [--out RUN_DIR] [--method NAME] [--set key=value ...] [--resume|--overwrite]
pml-rank eval RUN_DIR [--which best|latest]
pml-rank embed RUN_DIR --split NAME --out FILE.npz|FILE.npy [--which best|latest]
pml-rank embed RUN_DIR --images DIR [--out FILE.npz]   # your own images: embeddings + file paths
pml-rank compare CONFIG... [--seeds N] [--out DIR] [--methods A,B] [--reference NAME] [--jobs K]
    [--resume|--overwrite] [--no-pictures]
pml-rank sweep CONFIG --method NAME --grid KEY=V1,V2 [--grid ...] [--seeds N] [--out DIR]
    [--reference CELL] [--jobs K] [--resume|--overwrite]
pml-rank check CONFIG... [--methods A,B] [--set key=value ...] [--device D] [--no-scan]   # build
    everything and read every image file's header, no training
pml-rank tune CONFIG [--methods A,B] [--trials N] [--storage URL] [--jobs K] [--out DIR]
pml-rank compare CONFIG --tuned DIR [--seeds S] [--allow-budget-change]   # the tuned methods on
    fresh seeds
pml-rank study CONFIG [--splits K] [--seeds S] [--trials N] [--methods A,B] [--reference NAME]
    [--jobs K] [--resume] [--no-pictures] [--out DIR]   # tune every method with the same budget,
    retrain the tuned settings on K class-disjoint splits x S seeds -> study.md: per-split and
    pooled verdicts
pml-rank list [SUBSTRING] [--kind KIND]   # names the registry resolves, grouped by kind (losses,
    miners, samplers, trainers, datasets, models, optimizers, other), and what they resolve to;
    --kind configs: the shipped configs
Every command that reads configs or run folders takes --data-root DIR (default $PML_RANK_DATA;
for eval and embed the run's saved data_root), --device (cpu, cuda, cuda:N, mps) and
--allow-module MODULE; train/compare/sweep/check/tune/study take --set; train/compare/tune/study take
--compile (torch.compile the models and losses: --set trainer.compile=true).
torchrun --nproc_per_node=R -m pml_rank_plugins train|compare ...   # R processes, one
    global batch (trainer.batch_size) split over them; see the "Scaling" page of the docs

CONFIG is a YAML file or the name of a shipped config (``default``, ``omniglot``,
``ablations/fastap_bins``, ``benchmarks/mlrc_cub200``, ...); a file wins.
Exit status: 0 success, 1 the run failed (non-finite loss, bad data, busy or unreadable run
folder), 2 a config or command-line mistake. ``-v`` shows PML's log and full tracebacks.

The commands live in :mod:`pml_rank_plugins.commands`, one class per command with its options and
its action (``COMMANDS`` lists them); this module parses the command line, sets up logging and
turns errors into one line and an exit status.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .cli_args import build_parser
from .commands import COMMANDS, BadConfig, Command, check_device

__all__ = ["main"]

# Only the standard library at module level: `--help` and argument errors answer without importing
# torch, PML, scipy or matplotlib (seconds); the commands import the subpackages when they run.


def main(argv: list[str] | None = None) -> int:
    """Run ``pml-rank``; ``--help`` and argparse's own errors leave through ``SystemExit``.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status (see the module docstring).
    """
    try:
        try:
            args = build_parser().parse_args(argv)  # --help exits here, before torch is imported
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # PML's log, faiss's loader lines, fontTools' PDF subsetting: only with -v
        for name in ("PML", "faiss", "fontTools"):
            logging.getLogger(name).setLevel(logging.WARNING)
    command = COMMANDS[args.command]()
    try:
        rc = _guarded(command, args) if command.loads_configs else command.run(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except BadConfig as e:  # and BadArgument
        print(f"pml-rank: {e.kind}: {e}", file=sys.stderr)
        return 2


def _guarded(command: Command, args: argparse.Namespace) -> int:
    """Run a command that loads configs: config mistakes exit 2, failed runs exit 1."""
    from .experiment import ConfigError, UnknownNameError, allow_modules
    from .running import NonFiniteError, RunFolderError, StorageError, shutdown

    try:
        if args.allow_module:  # before any config or run folder is read
            allow_modules(args.allow_module)
        check_device(args.device)
        return command.run(args)
    except (BrokenPipeError, BadConfig):
        raise
    except (ConfigError, UnknownNameError) as e:
        _report(args, "config error", e)
        return 2
    except (NonFiniteError, RunFolderError, StorageError, ValueError, TypeError, OSError) as e:
        _report(args, "error", e)
        return 1
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 -- one line, never a traceback unless --debug
        _report(args, "error", e, hint=True)
        return 1
    finally:
        shutdown()  # under torchrun: the process group runner.train started


def _closed_pipe() -> int:
    """`pml-rank list | head`: the reader left. Say nothing (stdout goes to /dev/null so the
    interpreter's final flush cannot fail either) and exit 1, like other Unix tools."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _report(args: argparse.Namespace, kind: str, e: BaseException, hint: bool = False) -> None:
    """One line ``pml-rank: KIND: message`` on stderr (and the traceback with -v or --debug)."""
    if args.verbose or args.debug:
        logging.getLogger(__name__).exception("%s", kind)
    text = " ".join(str(e).split()) or "(no message)"
    if hint:  # an error we did not anticipate: name its type, and where to see more
        text = f"{type(e).__name__}: {text}" + ("" if args.debug else " (--debug: traceback)")
    print(f"pml-rank: {kind}: {text}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
