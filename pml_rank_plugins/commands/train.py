"""``pml-rank train``: train one config (every method in it, or ``--method``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .base import Command, check_config_devices, config_paths, data_root, load
from .options import CONFIG_HELP, add_common, add_compile, add_resume, compile_overrides

__all__ = ["Train"]


class Train(Command):
    """Train each selected method of CONFIG into its run folder; print its test metrics."""

    name = "train"
    help = "train one config (every method in it, or --method), e.g. pml-rank train default"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help=CONFIG_HELP)
        parser.add_argument(
            "--out",
            default=None,
            help="run folder, e.g. --out runs/fastap (default runs/<config stem>; one sub-folder "
            "per method when several are trained)",
        )
        parser.add_argument(
            "--method", default=None, help='train only this method, e.g. --method "plugin FastAP"'
        )
        add_resume(
            parser,
            "continue from checkpoints/latest.pt; the config may only change the budget and "
            "data_root (--set trainer.num_epochs=12 extends a finished run)",
        )
        add_common(parser)
        add_compile(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..experiment import collect_methods, slug
        from ..running import is_main_process, named_timeouts, train

        args.overrides = compile_overrides(args)  # --compile: the first --set
        methods = [args.method] if args.method else None
        (path,) = config_paths([args.config])
        configs = load(collect_methods, [path], args.overrides, methods, data_root(args))
        check_config_devices(args, configs)
        out = Path(args.out or Path("runs") / path.stem)
        for name, cfg in configs.items():
            run_dir = out if len(configs) == 1 else out / slug(name)
            with named_timeouts():  # torchrun: a stuck rank is named, not a gloo traceback
                metrics = train(
                    cfg, run_dir, resume=args.resume, device=args.device, overwrite=args.overwrite
                )
            if is_main_process():  # torchrun: one report, from rank 0
                print(json.dumps({"run_dir": str(run_dir), "test": metrics.get("test")}, indent=2))
        return 0
