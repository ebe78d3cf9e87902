"""The ``pml-rank`` argument parser: every subcommand, option and help text.

Standard library only, so ``pml-rank --help`` and argument errors answer without importing torch;
:mod:`pml_rank_plugins.cli` runs the commands.
"""

from __future__ import annotations

import argparse

from ._version import __version__

DEVICE_FORMS = "cpu, cuda, cuda:N or mps"
CONFIG_HELP = "YAML file or shipped config name, e.g. default, omniglot or configs/default.yaml"
CONFIGS_HELP = "YAML files or shipped config names, e.g. default or ablations/fastap_bins"

# The groups of `pml-rank list`; the same tuple as experiment.registry.KINDS (kept here so that
# argument errors answer without importing torch; a test checks the two agree).
LIST_KINDS = (
    "losses",
    "miners",
    "samplers",
    "trainers",
    "datasets",
    "models",
    "optimizers",
    "other",
)

EPILOG = """examples:
  pml-rank compare default --out runs/default           # shipped config, every method
  pml-rank train configs/default.yaml --method "plugin FastAP" --out runs/fastap
  pml-rank train default --method "plugin FastAP" --out runs/fastap --resume \\
      --set trainer.num_epochs=12                         # extend a finished run
  pml-rank eval runs/fastap --which latest
  pml-rank embed runs/fastap --split test --out test.npz
  pml-rank list FastAP
  pml-rank list --kind losses
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``pml-rank`` argument parser (standard library only: ``--help`` stays fast)."""
    p = argparse.ArgumentParser(
        prog="pml-rank",
        description="Command line interface ``pml-rank`` (also ``python -m pml_rank_plugins``).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log PML's INFO messages and full tracebacks"
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument(
        "--debug",
        action="store_true",
        help="print the full traceback of an error (otherwise one line naming the file or key)",
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
        help="continue from checkpoints/latest.pt; the config may only change the budget and "
        "data_root "
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

    em = sub.add_parser(
        "embed",
        help="embed a split with a trained run's model into .npz/.npy, e.g. "
        "pml-rank embed runs/fastap --split test --out test.npz",
    )
    em.add_argument("run_dir", help="the --out of a train run, e.g. runs/fastap")
    em.add_argument(
        "--split", required=True, metavar="NAME", help="a split of the run's config, e.g. test"
    )
    em.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="FILE.npz (embeddings, labels, split, run_dir, checkpoint) or FILE.npy (and "
        "FILE_labels.npy), e.g. --out test.npz",
    )
    em.add_argument(
        "--which",
        default="best",
        choices=["best", "latest"],
        help="checkpoint to load, e.g. --which latest (default best)",
    )
    add_device(em)
    add_data_root(em)

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
    c.add_argument(
        "--tuned",
        default=None,
        metavar="DIR",
        help="retrain every method with the best parameters of a `pml-rank tune` run, at the "
        "budget it was tuned at, on fresh seeds, e.g. --tuned runs/tune",
    )
    c.add_argument(
        "--allow-budget-change",
        action="store_true",
        help="with --tuned: let --set change the tuned budget (e.g. trainer.num_epochs); the "
        "change is recorded in summary.json",
    )
    c.add_argument(
        "--no-pictures",
        action="store_true",
        help="draw no retrieval pictures (existing ones are kept)",
    )

    tu = sub.add_parser(
        "tune",
        help="tune every method's search space with the same budget (Optuna), e.g. "
        "pml-rank tune tune_demo --out runs/tune",
    )
    tu.add_argument("config", help=CONFIG_HELP)
    tu.add_argument("--out", default="runs/tune", help="output folder, e.g. --out runs/tune")
    add_methods(tu)
    tu.add_argument(
        "--trials",
        type=int,
        default=None,
        metavar="N",
        help="trials per method (default: the config's tune.trials), e.g. --trials 20; "
        "rerunning continues the study up to N",
    )
    tu.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="Optuna storage shared by workers and machines, e.g. --storage "
        "postgresql://user@host/db (default sqlite:///OUT/tune.db)",
    )
    tu.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="K worker processes on each study, e.g. --jobs 2",
    )
    add_common(tu)

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

    ls = sub.add_parser(
        "list", help="list resolvable names by kind, e.g. pml-rank list --kind losses"
    )
    what = "show names or targets containing it (any case), e.g. FastAP"
    ls.add_argument("substring", nargs="?", default="", help=what)
    ls.add_argument(
        "--kind",
        choices=LIST_KINDS,
        metavar="KIND",
        help=f"only names of this kind ({', '.join(LIST_KINDS)}), e.g. --kind losses",
    )
    return p
