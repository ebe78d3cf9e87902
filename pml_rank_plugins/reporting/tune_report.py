"""``pml-rank tune`` outputs: ``tune.json``, ``tune.md``, ``tune_history.png`` and one
parameter-importance plot per method (``importance_<method>.png``).

``tune.json`` holds ``{"format": 2, "storage": URL without password, "out_dir", "trials",
"objective", "methods": {method: {best_params, best_value, best_trial, n_trials, states,
wall_seconds, seed, direction, config, config_hash, data_root}}}``: ``config`` is the complete
effective config the method's trials were built from (the budget), ``config_hash`` its hash;
``pml-rank compare CONFIG --tuned OUT`` trains exactly that
(``experiment.tuned.tuned_configs``). The history plot shows, per method, the best
validation value found so far against the trial number (complete trials only); the importance
plot is Optuna's fANOVA importance (needs two complete trials with different values).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from ..experiment.methods import check_methods, collect_methods, collected, slug
from ..experiment.search_space import check_tune_config
from ..experiment.space_values import check_space_values
from ..experiment.spec import EvalSettings, RunSpec
from ..experiment.tuned import TUNE_FILE, TUNE_FORMAT
from ..running.tune import tune
from . import style
from .tables import metric_label

LOGGER = logging.getLogger(__name__)


def collect_tune_methods(
    configs: Sequence[str | Path | Mapping],
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    data_root: str | None = None,
) -> dict[str, RunSpec]:
    """The selected methods' specs (validated once), with their tune sections checked (exit 2
    on any mistake, before anything trains). ``configs``: YAML paths and/or config dicts, or the
    ``{method: RunSpec}`` of :func:`~pml_rank_plugins.experiment.collect_methods` (the CLI's: not
    collected again)."""
    if collected(configs):
        selected = dict(configs)
    else:
        selected = collect_methods(configs, overrides, methods, data_root)
    check_methods(selected)
    for name, cfg in selected.items():
        check_tune_config(cfg, name)
        check_space_values(cfg, name)  # every value of the space builds, before any trial
    return selected


def run_tune(
    configs: Sequence[str | Path | Mapping],
    out_dir: str | Path,
    trials: int | None = None,
    storage: str | None = None,
    jobs: int = 1,
    device: str | None = None,
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    data_root: str | None = None,
) -> dict:
    """Tune the selected methods of ``configs`` (paths, dicts or the CLI's ``{method: RunSpec}``,
    see ``collect_tune_methods``) into ``out_dir``; write and return ``tune.json``."""
    selected = collect_tune_methods(configs, overrides, methods, data_root)
    summary, studies = tune(selected, out_dir, trials, storage, jobs, device)
    out_dir = Path(out_dir)
    summary["format"] = TUNE_FORMAT
    summary["out_dir"] = str(out_dir)
    summary["trials"] = {m: s["n_trials"] for m, s in summary["methods"].items()}
    primary = EvalSettings.parse(next(iter(selected.values()))).primary_metric
    summary["objective"] = f"validation {primary} at the best epoch"
    write_tune_outputs(summary, studies, out_dir, primary)
    return summary


def markdown(summary: Mapping, primary: str) -> str:
    """``tune.md``: one row per method."""
    lines = [
        f"Objective: validation {metric_label(primary)} at the best epoch (%), maximized. "
        f"Storage: `{summary['storage']}`.",
        "",
        "| method | best value (%) | best trial | trials | complete | pruned | failed | "
        "interrupted | trial seconds | best parameters |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for method, s in summary["methods"].items():
        st = s["states"]
        # interrupted trials (killed; no outcome, not counted in "trials") are FAIL in the study:
        # shown apart from the trials that failed (running.study.is_interrupted)
        stopped = s.get("n_interrupted", 0)
        best = "-" if s["best_value"] is None else f"{100 * s['best_value']:.2f}"
        params = ", ".join(f"`{k}`={_short(v)}" for k, v in (s["best_params"] or {}).items())
        lines.append(
            f"| {method} | {best} | {s['best_trial'] if s['best_trial'] is not None else '-'} | "
            f"{s['n_trials']} | {st.get('complete', 0)} | {st.get('pruned', 0)} | "
            f"{st.get('fail', 0) - stopped} | {stopped} | {_seconds(s)} | "
            f"{params or '-'} |"
        )
    lines += [
        "",
        "Trial seconds: the summed durations of the study's finished trials, over every `tune`"
        " call that ran them, interrupted trials left out (with `--jobs` above 1 they overlap;"
        " they depend on the machine's load). Re-train the best parameters on fresh seeds with `pml-rank compare CONFIG"
        " --tuned OUT`.",
    ]
    return "\n".join(lines) + "\n"


def _seconds(s: Mapping) -> str:
    """``trial_seconds`` (``tune.json`` files written before it: ``-``)."""
    return "-" if s.get("trial_seconds") is None else f"{s['trial_seconds']:,.0f}"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_tune_outputs(
    summary: dict, studies: Mapping[str, optuna.Study], out_dir: Path, primary: str
) -> list[Path]:
    """Write ``tune.json``, ``tune.md`` and the plots; returns the plot paths (PNG and PDF)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_history(studies, out_dir / "tune_history.png", primary)
    for method, study in studies.items():
        plots += write_importance(study, out_dir / f"importance_{slug(method)}.png", method)
    summary["plots"] = [str(p) for p in plots]
    # whole files or none: two tunes finishing together must not interleave their writes
    _replace_text(out_dir / TUNE_FILE, json.dumps(summary, indent=2))
    _replace_text(out_dir / "tune.md", markdown(summary, primary))
    return plots


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def best_so_far(study: optuna.Study) -> tuple[list[int], list[float]]:
    """(trial numbers, best complete value among trials up to and including each), for every
    trial from the first complete one on (pruned and failed trials carry the best forward)."""
    xs, ys, best = [], [], None
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if t.state == TrialState.COMPLETE:
            best = t.value if best is None else max(best, t.value)
        if best is not None:
            xs.append(t.number)
            ys.append(best)
    return xs, ys


def write_history(studies: Mapping[str, optuna.Study], path: Path, primary: str) -> list[Path]:
    """``tune_history.png`` (and ``.pdf``): best validation value so far vs trial, per method, in
    the comparison figures' style (:mod:`.style`: one colour per loss family, PML dashed)."""
    import matplotlib.ticker

    fig = style.new_figure(8, 4.5)
    ax = fig.add_subplot()
    styles = style.method_styles(studies)
    for method, study in studies.items():
        xs, ys = best_so_far(study)
        ys = [100 * y for y in ys]
        ax.step(xs, ys, where="post", label=method, linewidth=1.8, markersize=6, **styles[method])
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    style.label_axes(
        ax,
        "Tuning history: best validation value so far",
        "trial (pruned and failed trials keep the best so far)",
        f"best validation {metric_label(primary)} (%)",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=10)
    return style.save_figure(fig, path)


def write_importance(study: optuna.Study, path: Path, method: str) -> list[Path]:
    """A horizontal bar chart of Optuna's fANOVA parameter importances for one method (PNG and
    PDF), or no file (``[]``, with a log line) when the study cannot rank its parameters yet
    (fewer than two distinct complete values)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if len({t.value for t in complete}) < 2:
        LOGGER.info("[%s] no importance plot: fewer than two distinct complete values", method)
        return []
    importances = optuna.importance.get_param_importances(study)
    names = list(importances)[::-1]  # most important on top
    fig = style.new_figure(8, 1.9 + 0.45 * len(names))
    ax = fig.add_subplot()
    bars = ax.barh(names, [importances[n] for n in names], color=style.SERIES_COLORS[0])
    ax.bar_label(bars, fmt="%.2f", padding=3, fontsize=10)
    ax.set_xlim(0, 1.1)
    style.label_axes(
        ax,
        f"{method}\nparameter importance (fANOVA, {len(complete)} complete trials)",
        "importance (sums to 1)",
        "parameter (key path)",
    )
    return style.save_figure(fig, path)
