"""Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins.cli``).

pml-rank train CONFIG [--out RUN_DIR] [--method NAME] [--set key=value ...] [--resume]
pml-rank eval RUN_DIR [--which best|latest]
pml-rank compare CONFIG... [--seeds N] [--out DIR] [--methods A,B] [--reference NAME] [--jobs K]
pml-rank sweep CONFIG --method NAME --grid KEY=V1,V2 [--grid ...] [--seeds N] [--out DIR]
pml-rank list [SUBSTRING]      # names the registry resolves, and what they resolve to

torchrun --nproc_per_node=R -m pml_rank_plugins.cli train|compare ...   # R processes, one
    global batch (trainer.batch_size) split over them; see the README's "Scaling" section
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import yaml

from .config import compare, distributed, registry, runner, sweep
from .config.compare import slug
from .config.registry import UnknownNameError
from .config.schema import ConfigError

# Raised while loading/validating configs only (never caught around training).
CONFIG_ERRORS = (ConfigError, UnknownNameError, TypeError, ValueError, OSError, yaml.YAMLError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pml-rank", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log PML's INFO messages too")
    sub = p.add_subparsers(dest="command", required=True)

    def add_common(sp):
        sp.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value (dotted path, YAML value); repeatable",
        )
        sp.add_argument("--device", default=None, help="torch device (default: config or cpu)")

    t = sub.add_parser("train", help="train one config (every method in it, or --method)")
    t.add_argument("config")
    t.add_argument("--out", default=None, help="run folder (default runs/<config stem>)")
    t.add_argument("--method", default=None, help="train only this method of the config")
    t.add_argument("--resume", action="store_true", help="continue from checkpoints/latest.pt")
    add_common(t)

    e = sub.add_parser("eval", help="evaluate a run folder's best (or latest) checkpoint")
    e.add_argument("run_dir")
    e.add_argument("--which", default="best", choices=["best", "latest"])
    e.add_argument("--device", default=None)

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
        "compare", help="methods x seeds -> table with 95%% CIs, paired tests, plots"
    )
    c.add_argument("configs", nargs="+")
    c.add_argument("--seeds", type=int, default=1, help="number of seeds per method")
    c.add_argument("--out", default="runs/compare")
    c.add_argument("--methods", default=None, help="comma-separated subset of method names")
    c.add_argument(
        "--resume",
        action="store_true",
        help="reuse finished runs, continue interrupted ones, retry failed ones and rewrite the"
        " tables (re-summarizes without retraining)",
    )
    add_stats(c, "method")
    add_common(c)

    sw = sub.add_parser("sweep", help="one method over a grid of overrides x seeds -> table, plots")
    sw.add_argument("config", help="config file, e.g. configs/default.yaml")
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
    add_stats(sw, "cell")
    add_common(sw)

    ls = sub.add_parser("list", help="list resolvable names")
    ls.add_argument("substring", nargs="?", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("PML").setLevel(logging.WARNING)
    try:
        return _run(args)
    except _BadConfig as e:
        print(f"pml-rank: config error: {e}", file=sys.stderr)
        return 2
    finally:
        distributed.shutdown()  # under torchrun: the process group runner.train started


class _BadConfig(Exception):
    pass


def _load(fn, *args, **kwargs):
    """Load/validate configs, turning config mistakes into a clean message (exit code 2)."""
    try:
        return fn(*args, **kwargs)
    except CONFIG_ERRORS as e:
        raise _BadConfig(str(e)) from e


def _run(args) -> int:
    if args.command == "train":
        methods = [args.method] if args.method else None
        configs = _load(compare.collect_methods, [args.config], args.overrides, methods)
        out = Path(args.out or Path("runs") / Path(args.config).stem)
        for name, cfg in configs.items():
            run_dir = out if len(configs) == 1 else out / slug(name)
            metrics = runner.train(cfg, run_dir, resume=args.resume, device=args.device)
            if distributed.is_main_process():  # torchrun: one report, from rank 0
                print(json.dumps({"run_dir": str(run_dir), "test": metrics.get("test")}, indent=2))
    elif args.command == "eval":
        print(json.dumps(runner.evaluate(args.run_dir, args.which, args.device), indent=2))
    elif args.command == "compare":
        methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
        configs = _load(compare.collect_methods, args.configs, args.overrides, methods)
        if args.reference is not None and args.reference not in configs:
            raise _BadConfig(f"--reference {args.reference!r}: not one of {list(configs)}")
        _load(compare.check_configs, configs)  # fail fast, before the first run
        summary = compare.run_comparison(
            args.configs,
            args.out,
            seeds=args.seeds,
            overrides=args.overrides,
            methods=methods,
            resume=args.resume,
            device=args.device,
            reference=args.reference,
            jobs=args.jobs,
        )
        if distributed.is_main_process():  # torchrun: one report, from rank 0
            print(compare.markdown_table(summary))
            print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return _report_failures(summary)
    elif args.command == "sweep":
        _load(
            sweep.prepare_sweep, args.config, args.method, args.grid, args.overrides, args.reference
        )
        summary = sweep.run_sweep(
            args.config,
            args.method,
            args.grid,
            args.out,
            seeds=args.seeds,
            overrides=args.overrides,
            resume=args.resume,
            reference=args.reference,
            device=args.device,
            jobs=args.jobs,
        )
        print(compare.markdown_table(summary, "cell"))
        print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return _report_failures(summary)
    elif args.command == "list":
        for name, target in sorted(registry.all_names().items()):
            if args.substring.lower() in name.lower():
                print(f"{name:40s} {target}")
    return 0


def _report_failures(summary: dict) -> int:
    """Exit status 1 when any run failed (the others completed and are in the tables)."""
    failed = summary.get("failed") or []
    if failed:
        print(
            f"pml-rank: {len(failed)} run(s) failed; see the table and summary.json",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
