"""Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins``).

pml-rank train CONFIG [--out RUN_DIR] [--method NAME] [--set key=value ...] [--resume|--overwrite]
pml-rank eval RUN_DIR [--which best|latest]
pml-rank embed RUN_DIR --split NAME --out FILE.npz|FILE.npy [--which best|latest]
pml-rank compare CONFIG... [--seeds N] [--out DIR] [--methods A,B] [--reference NAME] [--jobs K]
    [--resume|--overwrite] [--no-pictures]
pml-rank sweep CONFIG --method NAME --grid KEY=V1,V2 [--grid ...] [--seeds N] [--out DIR]
    [--resume|--overwrite]
pml-rank check CONFIG... [--data-root DIR] [--set key=value ...]   # build everything, no training
pml-rank tune CONFIG [--methods A,B] [--trials N] [--storage URL] [--jobs K] [--out DIR]
pml-rank compare CONFIG --tuned DIR [--seeds S]   # the tuned methods on fresh seeds
pml-rank list [SUBSTRING] [--kind KIND]   # names the registry resolves, grouped by kind (losses,
    miners, samplers, trainers, datasets, models, optimizers, other), and what they resolve to
Every command that reads configs or run folders takes --data-root DIR (default $PML_RANK_DATA),
--device (cpu, cuda, cuda:N, mps) and --allow-module MODULE; train/compare/sweep/check take --set.
torchrun --nproc_per_node=R -m pml_rank_plugins train|compare ...   # R processes, one
    global batch (trainer.batch_size) split over them; see the "Scaling" page of the docs

CONFIG is a YAML file or the name of a shipped config (``default``, ``omniglot``,
``ablations/fastap_bins``, ``benchmarks/mlrc_cub200``, ...); a file wins.
Exit status: 0 success, 1 the run failed (non-finite loss, bad data, busy or unreadable run
folder), 2 a config or command-line mistake. ``-v`` shows PML's log and full tracebacks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

from .cli_args import DEVICE_FORMS, LIST_KINDS, build_parser

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
    try:
        rc = _list(args.substring, args.kind) if args.command == "list" else _guarded(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except _BadConfig as e:  # and _BadArgument
        print(f"pml-rank: {e.kind}: {e}", file=sys.stderr)
        return 2


def _guarded(args) -> int:
    """Run a command that loads configs: config mistakes exit 2, failed runs exit 1."""
    from .experiment import ConfigError, UnknownNameError, allow_modules
    from .running import NonFiniteError, RunFolderError, StorageError, shutdown

    try:
        if args.allow_module:  # before any config or run folder is read
            allow_modules(args.allow_module)
        _check_device(args.device)
        return _run(args)
    except (BrokenPipeError, _BadConfig):
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


def _check_device(device: str | None, key: str = "--device") -> None:
    """``--device`` (or a config's ``device``, ``key`` names which) is a device this machine
    has: one line (exit 2) instead of a CUDA traceback deep inside the first run."""
    if device is None:
        return
    if not isinstance(device, str) or not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise _BadArgument(f"{key} {device}: not a device; use {DEVICE_FORMS}")
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    available = ["cpu"] + [f"cuda:{i}" for i in range(cuda)]
    available += ["mps"] if torch.backends.mps.is_available() else []
    if ("cuda:0" if device == "cuda" else device) not in available:
        fix = "" if key == "--device" else "; pass --device cpu or change the config"
        raise _BadArgument(
            f"{key} {device}: not available here; available: {', '.join(available)}{fix}"
        )


def _check_config_devices(args, configs: dict) -> None:
    """Without ``--device``, every selected method's ``device:`` must exist here."""
    if args.device is None:
        for name, cfg in configs.items():
            _check_device(cfg.get("device"), f"method {name!r}: device")


def _closed_pipe() -> int:
    """`pml-rank list | head`: the reader left. Say nothing (stdout goes to /dev/null so the
    interpreter's final flush cannot fail either) and exit 1, like other Unix tools."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _report(args, kind: str, e: BaseException, hint: bool = False) -> None:
    if args.verbose or args.debug:
        logging.getLogger(__name__).exception("%s", kind)
    text = " ".join(str(e).split()) or "(no message)"
    if hint:  # an error we did not anticipate: name its type, and where to see more
        text = f"{type(e).__name__}: {text}" + ("" if args.debug else " (--debug: traceback)")
    print(f"pml-rank: {kind}: {text}", file=sys.stderr)


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
    from .reporting import markdown_table, prepare_sweep, run_comparison, run_sweep, run_tune
    from .running import (
        evaluate,
        is_main_process,
        named_timeouts,
        refuse_under_torchrun,
        repeated_logs_once,
        train,
    )

    if args.command == "train":
        methods = [args.method] if args.method else None
        (path,) = _config_paths([args.config])
        configs = _load(collect_methods, [path], args.overrides, methods, _data_root(args))
        _check_config_devices(args, configs)
        out = Path(args.out or Path("runs") / path.stem)
        for name, cfg in configs.items():
            run_dir = out if len(configs) == 1 else out / slug(name)
            with named_timeouts():  # torchrun: a stuck rank is named, not a gloo traceback
                metrics = train(
                    cfg, run_dir, resume=args.resume, device=args.device, overwrite=args.overwrite
                )
            if is_main_process():  # torchrun: one report, from rank 0
                print(json.dumps({"run_dir": str(run_dir), "test": metrics.get("test")}, indent=2))
    elif args.command == "eval":
        refuse_under_torchrun("eval")
        data_root = _data_root(args, env=False)  # the saved config's data_root unless given
        out = evaluate(args.run_dir, args.which, args.device, data_root=data_root)
        print(json.dumps(out, indent=2))
    elif args.command == "embed":
        return _embed(args)
    elif args.command == "compare":
        if args.allow_budget_change and not args.tuned:
            raise _BadArgument("--allow-budget-change applies only with --tuned DIR")
        methods = _methods(args)
        paths = _config_paths(args.configs)
        data_root = _data_root(args)
        configs = _load(collect_methods, paths, args.overrides, methods, data_root)
        _check_config_devices(args, configs)
        if args.reference is not None and args.reference not in configs:
            raise _BadConfig(f"--reference {args.reference!r}: not one of {list(configs)}")
        _load(check_methods, configs)  # fail fast, before the first run
        summary = run_comparison(
            paths,
            args.out,
            methods=methods,
            data_root=data_root,
            tuned=args.tuned,
            allow_budget_change=args.allow_budget_change,
            pictures=not args.no_pictures,
            **_pick(args, RUN_OPTIONS),
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
        if is_main_process():  # torchrun: one report, from rank 0
            print(markdown_table(summary, "cell"))
            print(f"total wall time: {summary['total_wall_seconds']:.1f} s; outputs in {args.out}")
        return _report_failures(summary)
    elif args.command == "tune":
        (path,) = _config_paths([args.config])
        configs = _load(collect_methods, [path], args.overrides, _methods(args), _data_root(args))
        _check_config_devices(args, configs)
        summary = run_tune(
            [path],
            args.out,
            trials=args.trials,
            storage=args.storage,
            jobs=args.jobs,
            device=args.device,
            overrides=args.overrides,
            methods=_methods(args),
            data_root=_data_root(args),
        )
        print((Path(args.out) / "tune.md").read_text(), end="")
        failed = sum(s["states"].get("fail", 0) for s in summary["methods"].values())
        print(f"outputs in {args.out}; {failed} failed trial(s)")
        empty = [m for m, s in summary["methods"].items() if s["best_params"] is None]
        if empty:
            print(f"pml-rank: no complete trial for {empty}; see tune.md", file=sys.stderr)
            return 1
    elif args.command == "check":
        paths = [str(p) for p in _config_paths(args.configs)]  # builds on --device or the CPU
        with repeated_logs_once():  # "metric_loss has no parameters" once, with a count
            lines = _load(
                check_configs, paths, args.overrides, _methods(args), args.device, _data_root(args)
            )
        for line in lines:
            print(line)
    return 0


def _embed(args) -> int:
    """``pml-rank embed``: a bad --out, a folder that is no finished run or a split the config
    lacks is exit 2 naming it, checked before anything is written."""
    from .running import (
        RunFolderError,
        embed,
        embeddings_files,
        load_run,
        refuse_under_torchrun,
        save_embeddings,
    )

    refuse_under_torchrun("embed")
    _argument(embeddings_files, args.out)  # before the model is built: fails in a second
    data_root = _data_root(args, env=False)  # the saved config's data_root unless given
    run = (args.run_dir, args.which, args.device, data_root)
    loaded = _argument(load_run, *run, errors=(RunFolderError,))
    if args.split not in loaded.datasets:
        have = ", ".join(loaded.datasets)
        raise _BadArgument(
            f"--split {args.split}: not in {args.run_dir}'s config; available: {have}"
        )
    embeddings, labels = embed(loaded, args.split)
    meta = {"split": args.split, "run_dir": str(args.run_dir), "checkpoint": str(loaded.checkpoint)}
    files = _argument(save_embeddings, args.out, embeddings, labels, **meta)
    print(json.dumps({"files": [str(f) for f in files], "shape": list(embeddings.shape), **meta}))
    return 0


def _argument(fn, *args, errors=(ValueError, OSError), **kwargs):
    """``fn(*args, **kwargs)``, its ``errors`` (a bad path or run folder) as exit status 2."""
    try:
        return fn(*args, **kwargs)
    except errors as e:
        raise _BadArgument(str(e)) from e


def _list(substring: str, kind: str | None = None) -> int:
    """The resolvable names grouped by kind (a ``losses:`` header, then one indented line per
    name: what to write in a config, and the class it resolves to), only ``kind``'s group when
    given; exit status 1 (and a line on stderr) when nothing matches."""
    from .experiment import listing

    needle = substring.lower()
    found = 0
    for group in LIST_KINDS if kind is None else (kind,):
        rows = [(n, t) for n, t in listing(group) if needle in n.lower() or needle in t.lower()]
        if not rows:
            continue
        print(f"{group}:" if not found else f"\n{group}:")
        for name, target in rows:
            print(f"  {name:40s} {target}")
        found += len(rows)
    if not found:
        where = f" among the {kind}" if kind else ""
        hint = "`pml-rank list` shows them all"
        print(f"pml-rank: no name or target{where} contains {substring!r}; {hint}", file=sys.stderr)
    return 0 if found else 1


def _report_failures(summary: dict) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
