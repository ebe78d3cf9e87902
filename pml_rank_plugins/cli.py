"""Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins``).

pml-rank train CONFIG [--out RUN_DIR] [--method NAME] [--set key=value ...] [--resume|--overwrite]
pml-rank eval RUN_DIR [--which best|latest]
pml-rank compare CONFIG... [--seeds N] [--out DIR] [--methods A,B] [--reference NAME] [--jobs K]
    [--resume|--overwrite]
pml-rank sweep CONFIG --method NAME --grid KEY=V1,V2 [--grid ...] [--seeds N] [--out DIR]
    [--resume|--overwrite]
pml-rank check CONFIG... [--data-root DIR] [--set key=value ...]   # build everything, no training
pml-rank list [SUBSTRING]      # names the registry resolves, and what they resolve to (exit 1: none)
Every command that reads configs or run folders takes --data-root DIR (default $PML_RANK_DATA),
--device (cpu, cuda, cuda:N, mps) and --allow-module MODULE; train/compare/sweep/check take --set.
torchrun --nproc_per_node=R -m pml_rank_plugins train|compare ...   # R processes, one
    global batch (trainer.batch_size) split over them; see the README's "Scaling" section

CONFIG is a YAML file or the name of a shipped config (``default``, ``omniglot``,
``ablations/fastap_bins``, ``benchmarks/mlrc_cub200``, ...); a file wins.
Exit status: 0 success, 1 the run failed (non-finite loss, bad data, busy or unreadable run
folder), 2 a config or command-line mistake. ``-v`` shows PML's log and full tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

# Only the standard library at module level: `--help` and argument errors answer without importing
# torch, PML, scipy or matplotlib (seconds); the commands import the subpackages when they run.

DEVICE_FORMS = "cpu, cuda, cuda:N or mps"
CONFIG_HELP = "YAML file or shipped config name, e.g. default, omniglot or configs/default.yaml"
CONFIGS_HELP = "YAML files or shipped config names, e.g. default or ablations/fastap_bins"

EPILOG = """examples:
  pml-rank compare default --out runs/default           # shipped config, every method
  pml-rank train configs/default.yaml --method "plugin FastAP" --out runs/fastap
  pml-rank train default --method "plugin FastAP" --out runs/fastap --resume \\
      --set trainer.num_epochs=12                         # extend a finished run
  pml-rank eval runs/fastap --which latest
  pml-rank list FastAP
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pml-rank",
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log PML's INFO messages and full tracebacks"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_common(sp):
        sp.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value (dotted path, YAML value), repeatable, e.g. "
            "--set trainer.num_epochs=2 --set 'optimizers.trunk_optimizer={Adam: {lr: 1e-4}}'",
        )
        add_device(sp)
        add_data_root(sp)

    def add_device(sp):
        sp.add_argument(
            "--device",
            default=None,
            help=f"torch device ({DEVICE_FORMS}), e.g. --device cuda:0 (default: the config's)",
        )

    def add_data_root(sp):
        sp.add_argument(
            "--data-root",
            default=None,
            metavar="DIR",
            help="folder that relative dataset roots and weights paths start from, e.g. "
            "--data-root /data (CUB at /data/CUB_200_2011); default $PML_RANK_DATA",
        )
        # Loading configs or run folders resolves class names: this widens what may be imported.
        sp.add_argument(
            "--allow-module",
            action="append",
            default=[],
            metavar="MODULE",
            help="let configs name classes from this module (repeatable), e.g. "
            "--allow-module my_project.losses",
        )

    def add_methods(sp):
        sp.add_argument(
            "--methods",
            default=None,
            help='comma-separated subset of method names, e.g. --methods "PML FastAP,plugin FastAP"',
        )

    def add_overwrite(sp):
        sp.add_argument(
            "--overwrite",
            action="store_true",
            help="replace what a run folder already holds (otherwise refused unless --resume)",
        )

    t = sub.add_parser(
        "train",
        help="train one config (every method in it, or --method), e.g. pml-rank train default",
    )
    t.add_argument("config", help=CONFIG_HELP)
    t.add_argument(
        "--out",
        default=None,
        help="run folder, e.g. --out runs/fastap (default runs/<config stem>; one sub-folder "
        "per method when several are trained)",
    )
    t.add_argument(
        "--method", default=None, help='train only this method, e.g. --method "plugin FastAP"'
    )
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue from checkpoints/latest.pt; the config may only change the budget "
        "(--set trainer.num_epochs=12 extends a finished run)",
    )
    add_overwrite(t)
    add_common(t)

    e = sub.add_parser(
        "eval",
        help="evaluate a run folder's best (or latest) checkpoint, e.g. pml-rank eval runs/x",
    )
    e.add_argument("run_dir", help="the --out of a train run, e.g. runs/fastap")
    e.add_argument(
        "--which",
        default="best",
        choices=["best", "latest"],
        help="checkpoint to evaluate, e.g. --which latest (default best)",
    )
    add_device(e)
    add_data_root(e)

    def add_stats(sp, what):
        sp.add_argument(
            "--reference",
            default=None,
            metavar="NAME",
            help=f"the {what} the others are compared with, paired by seed (default: the first),"
            + (' e.g. --reference "PML FastAP"' if what == "method" else " e.g. num_bins=10"),
        )
        sp.add_argument(
            "--jobs",
            type=int,
            default=1,
            metavar="K",
            help="run K trainings at once in worker processes (one GPU each, round robin, when"
            " several are visible); results equal --jobs 1, e.g. --jobs 2",
        )

    c = sub.add_parser(
        "compare",
        help="methods x seeds -> table with 95%% CIs, paired tests, plots, e.g. "
        "pml-rank compare default",
    )
    c.add_argument("configs", nargs="+", help=CONFIGS_HELP)
    c.add_argument("--seeds", type=int, default=1, help="seeds per method, e.g. --seeds 3")
    c.add_argument("--out", default="runs/compare", help="output folder, e.g. --out runs/default")
    add_methods(c)
    c.add_argument(
        "--resume",
        action="store_true",
        help="reuse finished runs, continue interrupted ones, retry failed ones and rewrite the"
        " tables (re-summarizes without retraining)",
    )
    add_overwrite(c)
    add_stats(c, "method")
    add_common(c)

    k = sub.add_parser(
        "check",
        help="build every object of every method without training, e.g. "
        "pml-rank check benchmarks/mlrc_cub200 --data-root /data",
    )
    k.add_argument("configs", nargs="+", help=CONFIGS_HELP)
    add_methods(k)
    add_common(k)

    sw = sub.add_parser(
        "sweep",
        help="one method over a grid of overrides x seeds -> table, plots, e.g. "
        'pml-rank sweep default --method "plugin FastAP" --grid trainer.batch_size=32,64',
    )
    sw.add_argument("config", help=CONFIG_HELP)
    sw.add_argument(
        "--method",
        default=None,
        help='the config\'s method to sweep (needed when it has several), e.g. "plugin FastAP"',
    )
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,...",
        help="a config key and its values (YAML, like --set); repeat for a Cartesian grid, e.g."
        " --grid loss_funcs.metric_loss.num_bins=5,10,20 --grid trainer.batch_size=32,64",
    )
    sw.add_argument(
        "--seeds", type=int, default=1, help="seeds per cell (the same for every cell), e.g. 3"
    )
    sw.add_argument("--out", default="runs/sweep", help="output folder, e.g. runs/bins")
    sw.add_argument(
        "--resume", action="store_true", help="skip finished runs, continue interrupted ones"
    )
    add_overwrite(sw)
    add_stats(sw, "cell")
    add_common(sw)

    ls = sub.add_parser("list", help="list resolvable names, e.g. pml-rank list FastAP")
    what = "show names or targets containing it (any case), e.g. FastAP"
    ls.add_argument("substring", nargs="?", default="", help=what)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``pml-rank``; ``--help`` and argparse's own errors leave through ``SystemExit``.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status (see the module docstring).
    """
    try:
        try:
            args = _parser().parse_args(argv)  # --help exits here, before torch is imported
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # PML's log, faiss's loader lines (imported after this) only with -v
        for name in ("PML", "faiss"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        rc = _list(args.substring) if args.command == "list" else _guarded(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except _BadConfig as e:  # and _BadArgument
        print(f"pml-rank: {e.kind}: {e}", file=sys.stderr)
        return 2


def _guarded(args) -> int:
    """Run a command that loads configs: config mistakes exit 2, failed runs exit 1."""
    from . import experiment  # its registry module (allow_modules is not re-exported)
    from .experiment import ConfigError, UnknownNameError
    from .running import NonFiniteError, RunFolderError, shutdown

    try:
        if args.allow_module:  # before any config or run folder is read
            experiment.registry.allow_modules(args.allow_module)
        _check_device(args.device)
        return _run(args)
    except (BrokenPipeError, _BadConfig):
        raise
    except (ConfigError, UnknownNameError) as e:
        _report(args, "config error", e)
        return 2
    except (NonFiniteError, RunFolderError, ValueError, TypeError, OSError) as e:
        _report(args, "error", e)
        return 1
    finally:
        shutdown()  # under torchrun: the process group runner.train started


def _check_device(device: str | None) -> None:
    """``--device`` names a device this machine has: one line (exit 2) instead of a CUDA
    traceback deep inside the first run."""
    if device is None:
        return
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise _BadArgument(f"--device {device}: not a device; use {DEVICE_FORMS}")
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    available = ["cpu"] + [f"cuda:{i}" for i in range(cuda)]
    available += ["mps"] if torch.backends.mps.is_available() else []
    if ("cuda:0" if device == "cuda" else device) not in available:
        raise _BadArgument(
            f"--device {device}: not available here; available: {', '.join(available)}"
        )


def _closed_pipe() -> int:
    """`pml-rank list | head`: the reader left. Say nothing (stdout goes to /dev/null so the
    interpreter's final flush cannot fail either) and exit 1, like other Unix tools."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _report(args, kind: str, e: BaseException) -> None:
    if args.verbose:
        logging.getLogger(__name__).exception("%s", kind)
    print(f"pml-rank: {kind}: {e}", file=sys.stderr)


class _BadConfig(Exception):
    kind = "config error"


class _BadArgument(_BadConfig):
    kind = "error"


def _load(fn, *args, **kwargs):
    """Load/validate configs, turning config mistakes into a clean message (exit code 2)."""
    import yaml

    from .experiment import ConfigError, UnknownNameError

    try:
        return fn(*args, **kwargs)
    except (ConfigError, UnknownNameError, TypeError, ValueError, OSError, yaml.YAMLError) as e:
        raise _BadConfig(str(e)) from e


def _data_root(args, env: bool = True) -> str | None:
    """``--data-root`` (else, with ``env``, ``$PML_RANK_DATA``) as an absolute path, or None."""
    from .experiment import resolve_data_root

    flag = getattr(args, "data_root", None)
    if flag is not None and not Path(flag).expanduser().is_dir():
        raise _BadConfig(f"--data-root {flag}: not a folder")
    if flag is None and not env:
        return None
    return resolve_data_root(flag)


def _config_paths(names: list[str]) -> list[Path]:
    from .experiment import resolve_config

    return [_load(resolve_config, n) for n in names]


# The options compare and sweep hand to run_comparison / run_sweep unchanged.
RUN_OPTIONS = ("seeds", "overrides", "resume", "overwrite", "reference", "device", "jobs")


def _pick(args, names) -> dict:
    return {name: getattr(args, name) for name in names}


def _methods(args) -> list[str] | None:
    return [m.strip() for m in args.methods.split(",")] if args.methods else None


def _run(args) -> int:
    from .experiment import check_configs, check_methods, collect_methods, slug
    from .reporting import markdown_table, prepare_sweep, run_comparison, run_sweep
    from .running import evaluate, is_main_process, train

    if args.command == "train":
        methods = [args.method] if args.method else None
        (path,) = _config_paths([args.config])
        configs = _load(collect_methods, [path], args.overrides, methods, _data_root(args))
        out = Path(args.out or Path("runs") / path.stem)
        for name, cfg in configs.items():
            run_dir = out if len(configs) == 1 else out / slug(name)
            metrics = train(
                cfg, run_dir, resume=args.resume, device=args.device, overwrite=args.overwrite
            )
            if is_main_process():  # torchrun: one report, from rank 0
                print(json.dumps({"run_dir": str(run_dir), "test": metrics.get("test")}, indent=2))
    elif args.command == "eval":
        data_root = _data_root(args, env=False)  # the saved config's data_root unless given
        out = evaluate(args.run_dir, args.which, args.device, data_root=data_root)
        print(json.dumps(out, indent=2))
    elif args.command == "compare":
        methods = _methods(args)
        paths = _config_paths(args.configs)
        data_root = _data_root(args)
        configs = _load(collect_methods, paths, args.overrides, methods, data_root)
        if args.reference is not None and args.reference not in configs:
            raise _BadConfig(f"--reference {args.reference!r}: not one of {list(configs)}")
        _load(check_methods, configs)  # fail fast, before the first run
        summary = run_comparison(
            paths, args.out, methods=methods, data_root=data_root, **_pick(args, RUN_OPTIONS)
        )
        if is_main_process():  # torchrun: one report, from rank 0
            print(markdown_table(summary))
            print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return _report_failures(summary)
    elif args.command == "sweep":
        (path,) = _config_paths([args.config])
        data_root = _data_root(args)
        _load(
            prepare_sweep, path, args.method, args.grid, args.overrides, args.reference, data_root
        )
        summary = run_sweep(
            path, args.method, args.grid, args.out, data_root=data_root, **_pick(args, RUN_OPTIONS)
        )
        print(markdown_table(summary, "cell"))
        print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return _report_failures(summary)
    elif args.command == "check":
        paths = [str(p) for p in _config_paths(args.configs)]
        lines = _load(
            check_configs, paths, args.overrides, _methods(args), args.device, _data_root(args)
        )
        for line in lines:
            print(line)
    return 0


def _list(substring: str) -> int:
    """One line per name: what to write in a config, and the class it resolves to; exit status 1
    (and a line on stderr) when nothing matches."""
    from .experiment import listing

    needle = substring.lower()
    found = [(n, t) for n, t in listing() if needle in n.lower() or needle in t.lower()]
    for name, target in found:
        print(f"{name:40s} {target}")
    if not found:
        hint = "`pml-rank list` shows them all"
        print(f"pml-rank: no name or target contains {substring!r}; {hint}", file=sys.stderr)
    return 0 if found else 1


def _report_failures(summary: dict) -> int:
    """Exit status 1 when any run failed (the others completed and are in the tables)."""
    failed = len(summary.get("failed") or [])
    if failed:
        print(f"pml-rank: {failed} run(s) failed; see the table and summary.json", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
