"""``pml-rank sweep``: one method over a Cartesian grid of config overrides, every cell paired.

``run_sweep("configs/default.yaml", "plugin FastAP", {"loss_funcs.metric_loss.num_bins":
["5", "10", "20"]}, seeds=3, out_dir="runs/bins")`` trains every grid cell (an ordinary
``--set KEY=VALUE`` override per key) with the same seeds ``seed, seed+1, ...``, so cells are
compared on paired runs exactly like methods in :mod:`.compare`. Outputs in ``out_dir``:
``<cell>/seed<S>/`` run folders (``S``: the seed), ``sweep.md``, ``sweep.csv`` (percent),
``sweep.json`` (every number; same statistics as ``compare``: 95% t intervals, paired
differences vs the reference cell, t-test and Wilcoxon p) and ``sweep_<key>.png`` (primary metric
vs each grid key with 95% bands; one line per combination of the other keys). ``resume`` skips
finished runs; a folder that already holds runs is refused unless ``overwrite`` (the policy of
:func:`~pml_rank_plugins.reporting.run_comparison`).
Under torchrun every rank trains every run and rank 0 alone writes the files.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import yaml

from ..experiment.methods import check_methods, collect_methods, slug
from ..experiment.schema import ConfigError, equivalence_margin
from ..running import distributed
from ..running.pool import execute, make_jobs
from . import style
from .compare import write_pictures
from .summary import add_command, primary_metric, summarize, write_outputs
from .tables import metric_label, split_title


def parse_grid(specs: Iterable[str]) -> dict[str, list[str]]:
    """``["a.b=1,2", "c=x,y"]`` -> ``{"a.b": ["1", "2"], "c": ["x", "y"]}`` (values kept as the
    YAML text given, parsed like ``--set`` values when applied)."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, raw = str(spec).partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not key or not values:
            raise ConfigError(
                f"--grid {spec!r}: expected KEY=V1,V2,... e.g. trainer.batch_size=32,64"
            )
        if key in grid:
            raise ConfigError(f"--grid {key!r} given twice; put all its values in one --grid")
        if len(set(values)) != len(values):
            raise ConfigError(f"--grid {spec!r}: repeated value")
        grid[key] = values
    if not grid:
        raise ConfigError("sweep: give at least one --grid KEY=V1,V2,...")
    return grid


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
    """The last dotted segment of each key when those are unique, else the full keys."""
    last = [k.split(".")[-1] for k in keys]
    return dict(zip(keys, last if len(set(last)) == len(last) else keys))


def grid_cells(grid: Mapping[str, Sequence[str]]) -> dict[str, dict[str, str]]:
    """``{cell name: {key: value}}`` over the Cartesian product, first key varying slowest."""
    short = _short_keys(list(grid))
    cells = {}
    for combo in itertools.product(*grid.values()):
        assign = dict(zip(grid, combo))
        cells[",".join(f"{short[k]}={v}" for k, v in assign.items())] = assign
    return cells


def run_sweep(
    config: str | Path | Mapping,
    method: str | None,
    grid: Mapping[str, Sequence[str]] | Sequence[str],
    out_dir: str | Path,
    seeds: int = 1,
    overrides: Iterable[str] = (),
    resume: bool = False,
    reference: str | None = None,
    device: str | None = None,
    jobs: int = 1,
    pictures: bool = False,
    data_root: str | None = None,
    overwrite: bool = False,
    prepared: tuple | None = None,
) -> dict:
    """Train ``method`` of ``config`` at every grid cell x seed; write ``sweep.*`` and plots.

    ``grid``: ``{key: [values]}`` or ``--grid`` strings. ``method`` may be None when the config
    has a single method. ``reference``: a cell name (default: the first cell). All cell configs
    are validated and their objects built before the first run (fail fast); failed runs are
    reported, not fatal (``summary["failed"]``). ``data_root``: as in
    :func:`~pml_rank_plugins.reporting.run_comparison`. ``resume`` reuses finished runs and
    continues the others; otherwise run folders that already hold runs are refused
    (:exc:`~pml_rank_plugins.running.RunFolderError`) unless ``overwrite``, which replaces them.
    Under torchrun rank 0 alone writes files. Returns the summary dict. ``prepared``: what
    :func:`prepare_sweep` returned for these arguments (the CLI's), so the cells are not collected
    and checked again.
    """
    out_dir = Path(out_dir)
    if prepared is None:
        prepared = prepare_sweep(config, method, grid, overrides, reference, data_root)
    method, grid, cells, configs = prepared
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    all_jobs = make_jobs(configs, out_dir, seeds)
    results = execute(all_jobs, resume, device, jobs, desc="sweep", overwrite=overwrite)
    first = next(iter(configs.values()))
    summary = summarize(
        results,
        reference=reference,
        primary=primary_metric(first),
        label="cell",
        margin=equivalence_margin(first),
    )
    summary.update(
        method=method,
        grid=grid,
        cells=cells,
        seeds=seeds,
        jobs=jobs,
        total_wall_seconds=time.perf_counter() - t0,
    )
    if distributed.is_main_process():  # under torchrun: rank 0 writes
        if pictures:
            t_pictures = time.perf_counter()
            summary["pictures"] = write_pictures(results, all_jobs, device)
            summary["pictures_seconds"] = time.perf_counter() - t_pictures
            summary["total_wall_seconds"] = time.perf_counter() - t0
        # a --resume adds its seconds to the record of the commands before it
        add_command(summary, out_dir / "sweep.json" if resume else None, jobs)
        write_outputs(summary, results, out_dir, stem="sweep")
        summary["plots"] = [str(p) for p in write_sweep_plots(summary, out_dir)]
        (out_dir / "sweep.json").write_text(json.dumps(summary, indent=2))
    distributed.barrier()
    return summary


def prepare_sweep(
    config: str | Path | Mapping,
    method: str | None,
    grid: Mapping[str, Sequence[str]] | Sequence[str],
    overrides: Iterable[str] = (),
    reference: str | None = None,
    data_root: str | None = None,
) -> tuple[str, dict, dict, dict]:
    """Validate everything before any run: returns ``(method, grid, cells, {cell: RunSpec})``.

    Raises ``ConfigError``/``ValueError`` (bad grid, unknown method or reference cell, a cell whose
    config does not validate or whose objects cannot be built).
    """
    if isinstance(grid, Mapping):
        grid = {k: [str(v) for v in vals] for k, vals in grid.items()}
    else:
        grid = parse_grid(grid)
    overrides = list(overrides)
    if method is None:
        available = collect_methods([config], overrides, None, data_root)
        if len(available) != 1:
            raise ConfigError(
                f"sweep: the config has methods {list(available)}; pick one: --method"
            )
        method = next(iter(available))
    cells = grid_cells(grid)
    if reference is not None and reference not in cells:
        raise ValueError(f"--reference {reference!r}: not a cell; cells: {list(cells)}")
    configs = {}
    for name, assign in cells.items():
        sets = overrides + [f"{k}={v}" for k, v in assign.items()]
        configs[name] = collect_methods([config], sets, [method], data_root)[method]
    check_methods(configs)
    return method, grid, cells, configs


def _numeric(values: Sequence[str]) -> list[float] | None:
    try:
        out = [yaml.safe_load(v) for v in values]
    except yaml.YAMLError:
        return None
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in out):
        return [float(v) for v in out]
    return None


def write_sweep_plots(summary: dict, out_dir: Path) -> list[Path]:
    """``sweep_<key>.png`` (and ``.pdf``) per grid key: the primary test metric (mean, 95% band,
    clipped to 0-100%) vs the key's values (numeric axis when all values are numbers), one line
    per setting of the other keys, in the comparison figures' palette (:mod:`.style`)."""
    grid, cells, rows = summary["grid"], summary["cells"], summary["rows"]
    primary = summary["primary_metric"]
    label_metric = metric_label(primary)
    where = split_title(summary).lower()  # "validation" for a config without eval.test
    paths: list[Path] = []
    for key, values in grid.items():
        xs = _numeric(values)
        x_of = dict(zip(values, xs if xs else range(len(values))))
        others = [k for k in grid if k != key]
        groups: dict[tuple, list[tuple[float, dict]]] = {}
        for name, assign in cells.items():
            st = rows[name].get(primary)
            if st:
                groups.setdefault(tuple(assign[k] for k in others), []).append(
                    (x_of[assign[key]], st)
                )
        labels = {
            other: ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, other))
            or summary["method"]
            for other in groups
        }
        styles = style.method_styles(labels.values())
        fig = style.new_figure(8, 4.5)
        ax = fig.add_subplot()
        for other, pts in groups.items():
            pts.sort(key=lambda p: p[0])
            x = np.array([p[0] for p in pts])
            m = np.array([100 * p[1]["mean"] for p in pts])
            h = np.array([100 * (p[1]["ci_half_width"] or 0.0) for p in pts])
            lab = labels[other]
            ax.plot(x, m, label=lab, linewidth=1.8, markersize=6, **styles[lab])
            ax.fill_between(
                x,
                np.clip(m - h, 0, 100),
                np.clip(m + h, 0, 100),
                color=styles[lab]["color"],
                alpha=0.12,
                linewidth=0,
            )
        if not xs:
            ax.set_xticks(range(len(values)))
            ax.set_xticklabels(values)
        elif len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels(values)
        style.label_axes(
            ax,
            f"{summary['method']}: {where} {label_metric} vs {key.split('.')[-1]}"
            " (mean, 95% band)",
            key,
            f"{where} {label_metric} (%)",
        )
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=10)
        paths += style.save_figure(fig, out_dir / f"sweep_{slug(key)}.png")
    return paths
