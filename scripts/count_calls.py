"""Count how often ``pml-rank train``/``compare`` re-derive what a config says (issue 30).

Runs the CLI in this process on a tiny config (the tiny dataset and model of ``tests/tiny.py``,
2 epochs x 3 iterations) with counters wrapped around the functions that parse, validate or build
from a config, and prints one Markdown table: a row per counted function, a column per command
(``train``: 1 run; ``compare``: 2 methods x 1 seed, ``--no-pictures`` and with pictures; then
the same comparison as the CLI runs it once it hands the specs it collected to
``run_comparison`` instead of the config paths: ``-`` before that was possible).

Every reference to a counted function inside the package (``from .schema import validate`` binds
the name in the importing module too) is replaced by the counting wrapper, so calls through any
module are counted. A function the package no longer has is shown as ``-``.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python scripts/count_calls.py``
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pml_rank_plugins.experiment  # noqa: E402,F401 -- load the package before patching
import pml_rank_plugins.reporting  # noqa: E402,F401
import pml_rank_plugins.running  # noqa: E402,F401
from pml_rank_plugins.cli import main  # noqa: E402
from pml_rank_plugins.experiment.schema import dump_yaml  # noqa: E402
from tests.tiny import tiny_config  # noqa: E402 -- registers TinyDataset/TinyNet

# row label -> (module, attribute) of the function to count; the first that exists is used
COUNTED = {
    "validate()": [("pml_rank_plugins.experiment.schema", "validate")],
    "eval_settings()": [
        ("pml_rank_plugins.experiment.spec", "EvalSettings.parse"),
        ("pml_rank_plugins.experiment.builder", "eval_settings"),
    ],
    "is_mlrc()": [
        ("pml_rank_plugins.experiment.spec", "Protocol.parse"),
        ("pml_rank_plugins.experiment.mlrc", "is_mlrc"),
    ],
    "build_models()": [("pml_rank_plugins.experiment.builder", "build_models")],
    "YAML reads": [("pml_rank_plugins.experiment.yamlfile", "load_yaml")],
    "registry.resolve()": [("pml_rank_plugins.experiment.registry", "resolve")],
}


def _lookup(module: str, attr: str):
    try:
        owner = importlib.import_module(module)
    except ImportError:
        return None, None, None
    parts = attr.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, None, None
    return owner, parts[-1], getattr(owner, parts[-1], None)


def install(counts: collections.Counter) -> dict[str, bool]:
    """Wrap every counted function (in its module and wherever the package bound its name)."""
    found = {}
    for label, candidates in COUNTED.items():
        found[label] = False
        for module, attr in candidates:
            owner, name, fn = _lookup(module, attr)
            if fn is None:
                continue
            raw = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
            is_class_attr = isinstance(owner, type)
            if is_class_attr:
                raw = owner.__dict__[name]
                inner = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw

                def counted(*a, _inner=inner, _label=label, **k):
                    counts[_label] += 1
                    return _inner(*a, **k)

                wrapped = (
                    type(raw)(counted) if isinstance(raw, (classmethod, staticmethod)) else counted
                )
                setattr(owner, name, wrapped)
            else:

                def counted(*a, _inner=fn, _label=label, **k):
                    counts[_label] += 1
                    return _inner(*a, **k)

                for mod_name, mod in list(sys.modules.items()):
                    if not mod_name.startswith("pml_rank_plugins") or mod is None:
                        continue
                    for key, value in list(vars(mod).items()):
                        if value is fn:
                            setattr(mod, key, counted)
            found[label] = True
            break
    return found


COUNTS: collections.Counter = collections.Counter()


def run(argv: list[str], found: dict[str, bool]) -> dict[str, int | None]:
    """Run ``pml-rank ARGV`` in this process; the calls of each counted function."""
    COUNTS.clear()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    if rc != 0:
        raise SystemExit(f"pml-rank {argv[0]} exited {rc}")
    return {k: (COUNTS[k] if found[k] else None) for k in COUNTED}


def run_library(path: Path, out: Path, pictures: bool, found: dict) -> dict[str, int | None]:
    """What ``pml-rank compare`` does once it hands its collected specs to ``run_comparison``
    (the CLI's ``collect_methods`` -> ``check_methods`` -> ``run_comparison(specs, ...)``)."""
    from pml_rank_plugins.experiment import check_methods, collect_methods
    from pml_rank_plugins.experiment.methods import collected
    from pml_rank_plugins.reporting import run_comparison

    COUNTS.clear()
    specs = collect_methods([path], (), None, None)
    if not collected(specs):  # before issue 30: collect_methods returned dicts
        return {k: None for k in COUNTED}
    check_methods(specs)
    with contextlib.redirect_stdout(io.StringIO()):
        run_comparison(specs, out, seeds=1, pictures=pictures)
    return {k: (COUNTS[k] if found[k] else None) for k in COUNTED}


def main_() -> None:
    logging.disable(logging.WARNING)
    found = install(COUNTS)
    methods = {
        "A": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}},
        "B": {"loss_funcs": {"metric_loss": {"TripletMarginLoss": {}}}},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dump_yaml(tiny_config(), tmp / "one.yaml")
        dump_yaml({**tiny_config(), "methods": methods}, tmp / "two.yaml")
        columns = {
            "`train`, 1 run": run(["train", str(tmp / "one.yaml"), "--out", str(tmp / "t")], found),
            "`compare`, 2 methods x 1 seed": run(
                ["compare", str(tmp / "two.yaml"), "--seeds", "1", "--no-pictures"]
                + ["--out", str(tmp / "c")],
                found,
            ),
            "`compare` with pictures": run(
                ["compare", str(tmp / "two.yaml"), "--seeds", "1", "--out", str(tmp / "p")], found
            ),
            "`compare`, specs handed on": run_library(tmp / "two.yaml", tmp / "s", False, found),
            "same, with pictures": run_library(tmp / "two.yaml", tmp / "sp", True, found),
        }
    print("| recomputed | " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for label in COUNTED:
        cells = ["-" if c[label] is None else str(c[label]) for c in columns.values()]
        name = f"`{label}`" if "(" in label else label
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main_()
