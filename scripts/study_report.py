"""Small reports of the Omniglot study (scripts/run_study.sh publish): the convergence probe and
the tuning's progress.

    python scripts/study_report.py runs/study docs/study

Tuning progress (``DOCS/tune/progress.md``), read from ``OUT/tune/tune.db`` while the studies
run (``tune.json`` is written only when every method is done): per method, trials by state, the
best validation value, its trial and parameters, and the epochs trained (each trial's last
reported epoch, summed).

Reads ``OUT/probe/<method>/seed<i>/metrics.json`` (validation primary metric per epoch) and
writes ``DOCS/probe/convergence.json``, ``convergence.md`` and ``probe_curves.png``:

* per run, the best-so-far validation curve (what early stopping keeps; a run that stopped early
  stays at its best after its last epoch);
* per method, the mean of those curves over seeds, its plateau (the last value) and the first
  epoch where the mean is within ``TOLERANCE`` (0.5 points) of the plateau;
* the budget: that epoch for the method with the highest plateau ("the best curve").

What tuning bought (``DOCS/tuning_gain.md`` and ``.json``, once both phases
have finished, i.e. written their ``summary.json``): per method, the test primary metric of its tuned setting
against its default setting on the same seeds (run ids), as a paired difference
(``reporting.statistics.paired_difference``: mean, 95% t interval, paired t-test, MDD), with the
methods' t-test p-values Holm-adjusted as one family.

Against the best method (``DOCS/<phase>/vs_best.md`` and ``.json`` for ``tuned`` and
``defaults``): ``compare`` tests every method against the config's first one (plugin FastAP);
the study's question is whether any method beats the best, so the phase's tables are recomputed
from its run folders (``reporting.summary.summarize_dir``, nothing trained, the phase's own
``comparison.md`` and ``summary.json`` untouched) with the reference set to the method of the
highest mean test primary metric. That reference is chosen after seeing the test results, which
the page states: it is the method the others must be shown not to trail.

Did the tuned (and default) settings converge at the budget? (``DOCS/<phase>/convergence.md``
and ``.json``, for ``tuned`` and ``defaults``):
the probe's analysis (:func:`convergence`) on the tuned runs' validation curves, plus, per method,
how much the mean best-so-far curve still rose over the last ``LATE`` epochs and how many runs
had their best epoch among them. The budget came from the probe at default settings; this says
how far the tuned settings were from their plateau.

The claims at a glance (``DOCS/claims.md``, once a claim's phase has finished): per claim, each
setting's test primary metric (mean ± 95% CI) and its paired difference against the claim's
reference setting (the config's first), with the Holm-adjusted t-test, the Holm-adjusted TOST
against the claim's declared margin, the MDD and the verdict, all read from the claim's
``summary.json`` (nothing recomputed).

Where a compare phase's time goes (``DOCS/wall_time.md`` and ``.json``, one row per finished
phase: ``tuned``, ``defaults``, each ``claims/<name>``): the runs' ``phase_seconds`` (setup,
train, validation, checkpoints, test; the call that finished each run, so a resumed run counts
its last call only) and the rest of each run's ``wall_seconds`` (process and folder bookkeeping),
as percent of the runs' summed wall seconds; the pictures' seconds (``summary.json``
``pictures_seconds``, written since this report; older phases: unknown) as percent of the
command's wall time; runs copied by ``scripts/study_reuse.py`` are counted apart, not timed
again.

Robustness across splits (issue 42; ``python scripts/study_report.py splits docs/study
docs/results.md``, no run folders needed): from the published ``summary.json`` files of the
study's split (``DOCS/tuned``, ``DOCS/claims/<claim>``) and of the other class splits
(``DOCS/splits/seed<k>``, ``DOCS/splits/claims<k>/<claim>``, written by
``scripts/run_splits.sh``; whichever have finished), per row its paired difference against the
reference (the methods: ``DOCS/tuned/vs_best.json``'s; a claim: its own) and verdict on each
split, recomputed from the rows' values by the study's rules, and the random-effects mean over
the splits (``reporting.statistics.random_effects_mean``) with Holm over the rows; "holds across
splits" when the direction is the same on every split and the pooled Holm p is below 0.05
(:func:`across_splits`). Writes ``DOCS/splits/robustness.json`` and ``.md`` and replaces the
generated regions (:func:`region_markers`) of the results page: the methods' table and its
sentences, the claims' tables, and the compute of the split steps with the command to resume.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
from scipy import stats  # noqa: E402

from pml_rank_plugins.data.splits import class_disjoint_split  # noqa: E402
from pml_rank_plugins.reporting import statistics  # noqa: E402
from pml_rank_plugins.reporting.summary import load_run_dirs, summarize_dir  # noqa: E402
from pml_rank_plugins.reporting.tables import (  # noqa: E402
    markdown_table,
    metric_label,
    test_metrics,
    verdict,
)
from pml_rank_plugins.running.study import is_interrupted  # noqa: E402

TOLERANCE = 0.005  # 0.5 points of the primary metric (a fraction)
PRIMARY = "mean_average_precision_at_r"  # configs/studies/omniglot.yaml's eval.primary_metric


def load_curves(probe: Path, primary: str) -> dict[str, dict[str, list[float]]]:
    """``{method: {run: [validation value per epoch]}}`` from the probe's run folders."""
    out: dict[str, dict[str, list[float]]] = {}
    for metrics in sorted(probe.glob("*/seed*/metrics.json")):
        m = json.loads(metrics.read_text())
        if m.get("status") != "finished" or not m.get("history"):
            continue
        vals = [next(iter(r["validation"].values()))[primary] for r in m["history"]]
        out.setdefault(m["name"], {})[metrics.parent.name] = vals
    return out


def best_so_far(values: list[float], epochs: int) -> np.ndarray:
    """Running maximum, carried to ``epochs`` entries (early stopping keeps the best)."""
    run = np.maximum.accumulate(np.asarray(values, dtype=float))
    return np.concatenate([run, np.full(epochs - run.size, run[-1])])


def convergence(curves: dict[str, dict[str, list[float]]]) -> dict:
    """Per method: seeds, mean best-so-far curve, plateau, converged epoch; and the budget."""
    epochs = max(len(v) for runs in curves.values() for v in runs.values())
    methods = {}
    for method, runs in curves.items():
        mean = np.mean([best_so_far(v, epochs) for v in runs.values()], axis=0)
        plateau = float(mean[-1])
        first = int(np.argmax(mean >= plateau - TOLERANCE)) + 1
        methods[method] = {
            "seeds": len(runs),
            "epochs_run": {r: len(v) for r, v in runs.items()},
            "mean_best_so_far": mean.tolist(),
            "plateau": plateau,
            "converged_epoch": first,
        }
    best = max(methods, key=lambda k: methods[k]["plateau"])
    return {
        "tolerance": TOLERANCE,
        "best_method": best,
        "budget_epochs": methods[best]["converged_epoch"],
        "methods": methods,
    }


def markdown(report: dict) -> str:
    lines = [
        "| method | seeds | epochs run (per seed) | plateau (%) | within 0.5 points from epoch |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for method, m in report["methods"].items():
        runs = ", ".join(str(m["epochs_run"][r]) for r in sorted(m["epochs_run"]))
        lines.append(
            f"| {method} | {m['seeds']} | {runs} | {100 * m['plateau']:.2f} | "
            f"{m['converged_epoch']} |"
        )
    lines += [
        "",
        f"Best curve: {report['best_method']}; budget: {report['budget_epochs']} "
        "epochs (the first epoch where its mean best-so-far validation value is within 0.5 "
        "points of its plateau).",
    ]
    return "\n".join(lines) + "\n"


def plot(curves: dict, report: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for i, (method, runs) in enumerate(curves.items()):
        color = f"C{i}"
        for vals in runs.values():
            ax.plot(
                range(1, len(vals) + 1),
                [100 * v for v in vals],
                color=color,
                alpha=0.3,
                linewidth=0.8,
            )
        mean = report["methods"][method]["mean_best_so_far"]
        ax.plot(
            range(1, len(mean) + 1),
            [100 * v for v in mean],
            color=color,
            linewidth=2,
            label=f"{method} (mean best so far)",
        )
    ax.axvline(report["budget_epochs"], color="k", linestyle=":", label="budget")
    ax.set_xlabel("epoch (50 updates each)")
    ax.set_ylabel("validation MAP@R (%)")
    ax.set_title("Convergence probe: validation MAP@R per epoch (thin: each seed)")
    ax.legend(fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short_names(paths: list[str]) -> dict[str, str]:
    """A column-friendly name per key path: its last component (``lr``), or its first and last
    (``loss_funcs.margin``, ``mining_funcs.margin``) where the last is shared."""
    last = [p.rsplit(".", 1)[-1] for p in paths]
    return {
        p: (f"{p.split('.', 1)[0]}.{end}" if last.count(end) > 1 else end)
        for p, end in zip(paths, last)
    }


def tune_progress(out: Path) -> str:
    """The Markdown table of the tuning's progress (see the module docstring)."""
    db = out / "tune" / "tune.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{db.resolve()}")
    lines = [
        "| method | trials | complete | pruned | failed | running | interrupted | best (%) | "
        "best trial | epochs trained | best parameters |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        # interrupted trials (killed, session ended) hold no outcome and do not count toward the
        # budget (running.study.is_interrupted): "trials" and "failed" leave them out
        stopped = sum(is_interrupted(t) for t in trials)
        count = {
            s: sum(t.state.name == s for t in trials)
            for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")
        }
        count["FAIL"] -= stopped
        epochs = sum(max(t.intermediate_values, default=0) for t in trials)
        done = [t for t in trials if t.state.name == "COMPLETE"]
        best = max(done, key=lambda t: t.value) if done else None
        names = short_names(list(best.params) if best else [])
        params = ", ".join(
            f"`{names[k]}`={v:.4g}" if isinstance(v, float) else f"`{names[k]}`={v}"
            for k, v in (best.params if best else {}).items()
        )
        lines.append(
            f"| {summary.study_name} | {len(trials) - stopped} | {count['COMPLETE']} | "
            f"{count['PRUNED']} | {count['FAIL']} | {count['RUNNING']} | {stopped} | "
            f"{'-' if best is None else f'{100 * best.value:.2f}'} | "
            f"{'-' if best is None else best.number} | {epochs} | {params or '-'} |"
        )
    storage.engine.dispose()
    return "\n".join(lines) + "\n"


def _primary_values(by_run: dict, primary: str) -> dict[str, float]:
    """``{run_id: test primary value}`` of the finished runs (failed ones have no test)."""
    out = {}
    for run_id, m in by_run.items():
        value = test_metrics(m).get(primary)
        if value is not None and np.isfinite(value):
            out[run_id] = float(value)
    return out


def tuning_gain(tuned: Path, defaults: Path, primary: str = PRIMARY) -> dict:
    """Per method: tuned minus default test ``primary`` on the run ids both have (see the module
    docstring). Returns ``{"primary", "methods": {name: {"n", "default", "tuned", "gain"}}}``
    with ``default``/``tuned`` t intervals and ``gain`` a paired difference plus
    ``p_ttest_holm``; methods without a shared finished run are left out."""
    runs_tuned, runs_default = load_run_dirs(tuned), load_run_dirs(defaults)
    out: dict = {"primary": primary, "methods": {}}
    for name, by_run in runs_tuned.items():
        a = _primary_values(by_run, primary)
        b = _primary_values(runs_default.get(name, {}), primary)
        ids = [r for r in a if r in b]
        if not ids:
            continue
        x, y = [a[r] for r in ids], [b[r] for r in ids]
        out["methods"][name] = {
            "n": len(ids),
            "run_ids": ids,
            "tuned": statistics.t_interval(x),
            "default": statistics.t_interval(y),
            "gain": statistics.paired_difference(x, y),
        }
    gains = [m["gain"] for m in out["methods"].values()]
    for gain, p in zip(gains, statistics.holm([g["p_ttest"] for g in gains])):
        gain["p_ttest_holm"] = p
    return out


def tuning_gain_markdown(report: dict) -> str:
    label = metric_label(report["primary"])
    lines = [
        f"Test {label} (%), tuned against default settings on the same seeds; gain = tuned -"
        " default, paired (* where the 95% t interval excludes 0); p: paired t-test, Holm over the methods; MDD: the"
        " smallest gain detectable at 80% power with these n and paired spread.",
        "",
        f"| method | n | default {label} | tuned {label} | gain (± 95% CI) | p (Holm) | MDD |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in report["methods"].items():
        g = m["gain"]
        mdd = "-" if g["mdd"] is None else f"{100 * g['mdd']:.2f}"
        lines.append(
            f"| {name} | {m['n']} | {statistics.format_mean_ci(m['default'])} | "
            f"{statistics.format_mean_ci(m['tuned'])} | {statistics.format_difference(g)} | "
            f"{statistics.format_p(g['p_ttest_holm'])} | {mdd} |"
        )
    return "\n".join(lines) + "\n"


def best_method(runs: dict, primary: str = PRIMARY) -> str:
    """The method of ``{name: {run_id: metrics}}`` with the highest mean test ``primary`` over
    its finished runs (ties: the first in table order)."""
    means = {
        n: np.mean(list(v.values())) for n, r in runs.items() if (v := _primary_values(r, primary))
    }
    if not means:
        raise ValueError(f"no finished run with a test {primary}")
    return max(means, key=lambda n: (means[n], -list(means).index(n)))


def vs_best(phase: Path, primary: str = PRIMARY) -> dict:
    """``phase``'s comparison summary recomputed with the best method (:func:`best_method`) as
    the reference; nothing is written into ``phase``."""
    best = best_method(load_run_dirs(phase), primary)
    summary = summarize_dir(phase, reference=best, write=False)
    summary["reference_rule"] = f"highest mean test {primary} of the table"
    return summary


def vs_best_markdown(summary: dict, phase: str) -> str:
    return (
        f"The `{phase}` runs against the method with the highest mean test"
        f" {metric_label(summary['primary_metric'])}, **{summary['reference']}** (chosen after"
        " seeing the test results; every other method is tested against it, Holm over the"
        " table). Recomputed from the run folders by `scripts/study_report.py`; the phase's"
        " `comparison.md` tests against the config's first method.\n\n" + markdown_table(summary)
    )


def claims_markdown(out: Path) -> str | None:
    """The compact table of every finished claim (see the module docstring); ``None`` if none."""
    parts = []
    for summary_file in sorted((out / "claims").glob("*/summary.json")):
        summary = json.loads(summary_file.read_text())
        primary, ref = summary["primary_metric"], summary["reference"]
        label = metric_label(primary)
        margin = summary.get("equivalence_margin")
        parts += [
            f"### {summary_file.parent.name} (reference: {ref}; "
            + (f"margin ±{margin} points)" if margin else "no equivalence margin)"),
            "",
            f"| setting | n | {label} | Δ{label} vs reference | p t-test Holm | p TOST Holm |"
            " MDD | verdict |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for name, row in summary["rows"].items():
            d = (summary["differences"].get(name) or {}).get(primary)
            cells = [name, str(row[primary]["n"]), statistics.format_mean_ci(row[primary])]
            if d is None:
                cells += ["(reference)", "", "", "", ""]
            else:
                mdd = "-" if d["mdd"] is None else f"{100 * d['mdd']:.2f}"
                cells += [
                    statistics.format_difference(d),
                    statistics.format_p(d.get("p_ttest_holm")),
                    statistics.format_p(d.get("p_tost_holm")),
                    mdd,
                    d.get("verdict", "-"),
                ]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    if not parts:
        return None
    head = (
        "Test MAP@R (%) of each claim's settings on 10 paired seeds; Δ = setting - reference,"
        " mean ± 95% CI; Holm over the claim's rows; TOST against the margin declared in the"
        " claim's config before it ran. From `docs/study/claims/<claim>/summary.json`.\n\n"
    )
    return head + "\n".join(parts)


LATE = 5  # epochs: the end of the budget whose gain says whether a run was still improving


def convergence_check(phase: Path, primary: str = PRIMARY) -> dict:
    """:func:`convergence` of ``phase``'s runs plus, per method, ``late_gain`` (mean best-so-far
    at the last epoch minus ``LATE`` epochs before) and ``best_in_late`` (runs whose first best
    epoch is among the last ``LATE``)."""
    curves = load_curves(phase, primary)
    report = convergence(curves)
    epochs = max(len(v) for runs in curves.values() for v in runs.values())
    report["late_epochs"] = LATE
    for method, m in report["methods"].items():
        mean = m["mean_best_so_far"]
        m["late_gain"] = mean[-1] - mean[-1 - LATE]
        m["best_in_late"] = sum(
            int(np.argmax(v)) + 1 > epochs - LATE for v in curves[method].values()
        )
    return report


def convergence_check_markdown(report: dict) -> str:
    late = report["late_epochs"]
    lines = [
        f"| method | runs | best-so-far at the end (%) | within 0.5 points from epoch | gain over"
        f" the last {late} epochs (points) | runs with their best in the last {late} epochs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, m in report["methods"].items():
        lines.append(
            f"| {method} | {m['seeds']} | {100 * m['plateau']:.2f} | {m['converged_epoch']} |"
            f" {100 * m['late_gain']:.2f} | {m['best_in_late']} |"
        )
    return "\n".join(lines) + "\n"


PHASES = ("setup", "train", "validation", "checkpoints", "test")


def wall_time(phase: Path) -> dict:
    """Seconds per phase of ``phase``'s finished runs (see the module docstring)."""
    summary = json.loads((phase / "summary.json").read_text())
    seconds = dict.fromkeys(PHASES, 0.0)
    wall, runs, reused, untimed = 0.0, 0, 0, 0
    for by_run in load_run_dirs(phase).values():
        for m in by_run.values():
            if m.get("status") != "finished":
                continue
            if m.get("reused_from"):
                reused += 1
                continue
            if "phase_seconds" not in m or "wall_seconds" not in m:
                untimed += 1  # written before runs timed their phases
                continue
            runs += 1
            wall += m["wall_seconds"]
            for key, value in m["phase_seconds"].items():
                seconds[key] = seconds.get(key, 0.0) + value
    seconds["other"] = wall - sum(seconds.values())
    return {
        "runs": runs,
        "reused_runs": reused,
        "untimed_runs": untimed,
        "run_seconds": wall,
        "phase_seconds": seconds,
        "phase_percent": {k: 100 * v / wall if wall else None for k, v in seconds.items()},
        "command_seconds": summary.get("total_wall_seconds"),
        "jobs": summary.get("jobs"),
        "pictures_seconds": summary.get("pictures_seconds"),
    }


def wall_time_markdown(report: dict) -> str:
    cols = list(PHASES) + ["other"]
    lines = [
        "Where each compare phase's time goes: the runs' phases in percent of the runs' summed"
        ' wall seconds (the call that finished each run; "other": the rest of a run\'s wall'
        " time, e.g. writing its folder), and the pictures in percent of the command's wall time"
        ' ("-": not recorded by that command). Runs reused from the tuned phase are not timed'
        " again.",
        "",
        "| phase | runs (+ reused) | run seconds | "
        + " | ".join(f"{c} (%)" for c in cols)
        + " | command wall (s) | jobs | pictures (% of wall) |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in cols) + " | ---: | ---: | ---: |",
    ]
    for name, r in report.items():
        pct = [
            f"{r['phase_percent'][c]:.1f}" if r["phase_percent"][c] is not None else "-"
            for c in cols
        ]
        cmd, pics = r["command_seconds"], r["pictures_seconds"]
        untimed = f", {r['untimed_runs']} untimed" if r.get("untimed_runs") else ""
        pic = "-" if pics is None or not cmd else f"{100 * pics / cmd:.2f} ({pics:.0f} s)"
        lines.append(
            f"| {name} | {r['runs']} (+{r['reused_runs']}{untimed}) | {r['run_seconds']:,.0f} | "
            + " | ".join(pct)
            + f" | {'-' if cmd is None else f'{cmd:,.0f}'} | {r['jobs'] or '-'} | {pic} |"
        )
    return "\n".join(lines) + "\n"


# ---- Robustness across splits (issue 42) ------------------------------------------------------

SPLIT_KEY = "split.class_disjoint_split.seed"  # what `compare --allow-budget-change` records
SPLIT_STEPS = ("seed1", "seed2", "claims1", "seed3")  # scripts/run_splits.sh's steps, in order
PLANNED_SPLITS = {1, 2, 3}  # the split seeds of the steps seed<k>
SPLIT_CLAIMS = ("batch_size", "rll_margin_tn")  # the decided claims re-run by step claims<k>
STUDY_CLASSES = 136  # characters of images_background_small1 (configs/studies/omniglot.yaml)
STUDY_FRACTIONS = (0.5, 0.25, 0.25)  # its class_disjoint_split fractions (train, val, test)
RESUME_COMMAND = "PML_RANK_DATA=../shared/data OUT=runs/splits scripts/run_splits.sh"
REPORT_COMMAND = "python scripts/study_report.py splits docs/study docs/results.md"


def split_seed(summary: dict, where: str, expected: int) -> int:
    """The class split of a comparison: the ``split.class_disjoint_split.seed`` that its
    ``summary.json`` records in ``budget_changes`` (``compare --tuned ... --allow-budget-change
    --set``), else ``expected`` (a comparison run at its config's split, or a claim, whose
    ``--set`` is not recorded). A recorded seed other than ``expected`` raises ValueError naming
    ``where`` (the file): a folder named for one split must not hold another's runs."""
    used = {
        c["used"]
        for changes in (summary.get("budget_changes") or {}).values()
        for c in changes
        if c.get("key") == SPLIT_KEY
    }
    if len(used) > 1 or (used and used != {expected}):
        raise ValueError(f"{where}: records {SPLIT_KEY} = {sorted(used)}, expected {expected}")
    return expected


def _split_differences(
    summary: dict, reference: str, run_ids: set[str] | None = None
) -> dict[str, dict]:
    """``{name: paired difference of the primary metric against reference, with verdict}`` of
    one comparison, recomputed from its ``rows`` (values and run ids) with the study's rules
    (:func:`statistics.describe_runs`: Holm over the table's rows, TOST against the summary's
    margin; :func:`tables.verdict`); ``run_ids``: only those runs (every run when None)."""
    primary, margin = summary["primary_metric"], summary.get("equivalence_margin")
    if reference not in summary["rows"]:
        raise ValueError(f"reference {reference!r} is not a row of the summary")
    runs = {
        name: {
            rid: {primary: v}
            for rid, v in zip(row[primary]["run_ids"], row[primary]["values"])
            if run_ids is None or rid in run_ids
        }
        for name, row in summary["rows"].items()
        if primary in row
    }
    equivalence = {primary: margin / 100} if margin is not None else None
    described = statistics.describe_runs(runs, [primary], reference, equivalence)
    out = {}
    for name, row in described["differences"].items():
        if primary in row:
            out[name] = row[primary]
            out[name]["verdict"] = verdict(row[primary], margin)
    return out


def _direction(mean: float) -> str:
    return "higher" if mean > 0 else "lower" if mean < 0 else "zero"


def _pool(per_split: dict[int, dict | None]) -> dict | None:
    """:func:`statistics.random_effects_mean` of one row's per-split paired means (variance
    ``s^2 / n``); ``None`` when a split lacks the row or its spread (n < 2, zero variance)."""
    cells = list(per_split.values())
    if any(d is None or d["std"] is None or d["std"] <= 0 for d in cells):
        return None
    return statistics.random_effects_mean(
        [d["mean"] for d in cells], [d["std"] ** 2 / d["n"] for d in cells]
    )


def across_splits(summaries: dict[int, dict], reference: str) -> dict:
    """Every row's difference against ``reference`` on each split and pooled over the splits.

    ``summaries``: ``{split seed: summary.json}``, the study's split first (its row order is the
    table's). Per split: the paired difference on all its runs and its verdict, by the rules of
    the study's tables (:func:`_split_differences`). Pooled: the random-effects mean of the
    per-split mean differences (:func:`statistics.random_effects_mean`; DerSimonian-Laird,
    modified Hartung-Knapp, ``k - 1`` degrees of freedom), its p-values Holm-adjusted over the
    table's rows. The study's split enters the pooled test with the seeds the other splits ran
    (the union of their run ids: seeds 1-5), so each split weighs by one design and the split
    that chose the tuned settings and the reference does not count twice; ``pooled_all_seeds``
    repeats the analysis with all its seeds (a sensitivity check). ``holds``: the same direction
    on every split and the pooled Holm p below alpha.
    """
    seeds = list(summaries)
    if not seeds:
        raise ValueError("across_splits: no summaries")
    study, others = seeds[0], seeds[1:]
    primary = summaries[study]["primary_metric"]
    other_ids = {r for s in others for r in summaries[s]["rows"][reference][primary]["run_ids"]}
    per_split = {s: _split_differences(summaries[s], reference) for s in seeds}
    pooled_in = dict(per_split)
    if others:
        pooled_in[study] = _split_differences(summaries[study], reference, other_ids)
    names = [n for n in summaries[study]["rows"] if n != reference]
    rows: dict[str, dict] = {}
    for name in names:
        cells = {s: per_split[s].get(name) for s in seeds}
        rows[name] = {
            "splits": {str(s): cells[s] for s in seeds},
            "pooled": _pool({s: pooled_in[s].get(name) for s in seeds}) if others else None,
            "pooled_all_seeds": _pool(cells) if others else None,
            # the study split's difference on the pooled seeds (what enters "pooled")
            "study_split_pooled_seeds": pooled_in[study].get(name) if others else None,
        }
    for key in ("pooled", "pooled_all_seeds"):
        family = [r[key] for r in rows.values() if r[key] is not None]
        for p, adjusted in zip(family, statistics.holm([p["p"] for p in family])):
            p["p_holm"] = adjusted
    alpha = statistics.ALPHA
    for row in rows.values():
        means = [c["mean"] for c in row["splits"].values() if c is not None]
        same = len(means) == len(seeds) and len({_direction(m) for m in means}) == 1
        for key in ("pooled", "pooled_all_seeds"):
            p = row[key]
            row[f"holds{'' if key == 'pooled' else '_all_seeds'}"] = bool(
                p is not None and same and p.get("p_holm") is not None and p["p_holm"] < alpha
            )
        row["same_direction"] = same
    return {
        "reference": reference,
        "primary_metric": primary,
        "alpha": alpha,
        "splits": {
            str(s): {
                "n_seeds": len(summaries[s]["rows"][reference][primary]["run_ids"]),
                "run_ids": summaries[s]["rows"][reference][primary]["run_ids"],
            }
            for s in seeds
        },
        "pooled_run_ids": {
            str(s): (
                sorted(other_ids, key=lambda r: (len(r), r))
                if s == study and others
                else summaries[s]["rows"][reference][primary]["run_ids"]
            )
            for s in seeds
        },
        "pooled_method": (
            "random-effects mean of the per-split paired mean differences: DerSimonian-Laird"
            " tau^2, modified Hartung-Knapp-Sidik-Jonkman interval and t-test on k - 1 degrees"
            " of freedom; Holm over the table's rows"
        ),
        "rows": rows,
    }


def _split_cell(d: dict | None) -> str:
    if d is None:
        return "not run"  # the split's comparison lacks the row (e.g. a --methods subset)
    return f"{statistics.format_difference(d)}: {d['verdict']}"


def _pooled_cell(p: dict | None) -> str:
    if p is None or p["se"] is None:
        return "-"
    tau = 100 * math.sqrt(p["tau2"])
    return f"{100 * p['mean']:+.2f} ± {100 * p['ci_half_width']:.2f} (τ {tau:.2f})"


def _holds_cell(row: dict, splits: list[str], alpha: float) -> str:
    p = row["pooled"]
    if len(splits) < 2:
        return "not tested (one split)"
    if p is None or p["se"] is None:
        return "not tested (a split lacks the row, or the spread of its differences)"
    if row["holds"]:
        return f"**yes ({_direction(p['mean'])})**"
    if not row["same_direction"]:
        signs = ", ".join(
            f"{s} {'+' if row['splits'][s]['mean'] > 0 else '-'}"
            for s in splits
            if row["splits"][s] is not None
        )
        return f"no: direction differs ({signs})"
    return f"no: pooled Holm p ≥ {alpha:g}"


def across_splits_table(report: dict, label: str) -> str:
    """The Markdown table of :func:`across_splits` (``label``: the first column's head)."""
    splits = list(report["splits"])
    label_metric = metric_label(report["primary_metric"])
    head = [f"{label} − {report['reference']} (Δ{label_metric}, points)"]
    for i, s in enumerate(splits):
        n = report["splits"][s]["n_seeds"]
        head.append(f"split {s}{' (study)' if i == 0 else ''}, n = {n}")
    head += ["pooled (95% CI; τ)", "p pooled (Holm)", "holds across splits"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- |" + " ---: |" * len(splits) + " ---: | ---: | --- |",
    ]
    for name, row in report["rows"].items():
        p = row["pooled"]
        pcell = (
            "-"
            if p is None or p["p"] is None
            else (f"{statistics.format_p(p['p'])} ({statistics.format_p(p['p_holm'])})")
        )
        cells = [name] + [_split_cell(row["splits"][s]) for s in splits]
        sub = row["study_split_pooled_seeds"]
        if sub is not None:
            cells[1] += f" (seeds {_seed_range(report['pooled_run_ids'][splits[0]])}:"
            cells[1] += f" {100 * sub['mean']:+.2f})"
        cells += [_pooled_cell(p), pcell, _holds_cell(row, splits, report["alpha"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _seed_range(run_ids: list[str]) -> str:
    """``"1-5"`` for seed1..seed5; the ids joined otherwise."""
    nums = [int(r[4:]) for r in run_ids if r.startswith("seed") and r[4:].isdigit()]
    if len(nums) == len(run_ids) and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"{nums[0]}-{nums[-1]}"
    return ", ".join(run_ids)


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _split_specific(name: str, row: dict, splits: list[str]) -> str:
    """``"m=0 (lower on split 0; also lower on split 1)"``: the study split's verdict, the
    other splits where the same direction was decided too and, when the mean difference has the
    same sign on every split without each deciding it, ``"; the same sign on every split"`` (a
    reader should see a consistent direction that the pooled test does not confirm)."""
    study = splits[0]
    verdict = row["splits"][study]["verdict"]
    direction = verdict.split()[0]
    also = [
        k
        for k in splits[1:]
        if row["splits"].get(k) is not None and row["splits"][k]["verdict"].startswith(direction)
    ]
    more = (
        f"; also {direction} on split{'s' if len(also) > 1 else ''} {_names(also)}" if also else ""
    )
    if row["same_direction"] and len(also) < len(splits) - 1:
        more += "; the same sign on every split"
    return f"{name} ({verdict} on split {study}{more})"


def across_splits_sentences(report: dict, what: str) -> str:
    """What holds across splits and what is split-specific, as sentences generated from
    :func:`across_splits` (``what``: how to name the rows, e.g. ``"method"``)."""
    splits = list(report["splits"])
    ref, study = report["reference"], splits[0]
    if len(splits) < 2:
        return (
            f"Only split {study} has finished: nothing can be said across splits yet, and every"
            " verdict is split-specific.\n"
        )
    held = {
        d: [
            n
            for n, r in report["rows"].items()
            if r["holds"] and _direction(r["pooled"]["mean"]) == d
        ]
        for d in ("higher", "lower")
    }
    out = []
    for d in ("lower", "higher"):
        if held[d]:
            out.append(
                f"**Holds across splits {_names(splits)}:** {_names(held[d])} "
                f"{'score' if len(held[d]) > 1 else 'scores'} {d} than {ref} (the same"
                " direction on every split and the pooled test significant after Holm)."
            )
    if not held["lower"] and not held["higher"]:
        out.append(
            f"**No {what}'s difference against {ref} holds across splits {_names(splits)}** (the"
            " same direction on every split and the pooled test significant after Holm)."
        )
    specific = [
        _split_specific(n, r, splits)
        for n, r in report["rows"].items()
        if not r["holds"]
        and r["splits"][study] is not None
        and r["splits"][study]["verdict"].startswith(("higher", "lower"))
    ]
    if specific:
        out.append(
            f"**Split-specific:** {_names(specific)}: decided on split {study}, not shown to hold"
            " across the splits."
        )
    changed = [n for n, r in report["rows"].items() if r["holds"] != r["holds_all_seeds"]]
    out.append(
        f"With all {report['splits'][study]['n_seeds']} seeds of split {study} in the pooled"
        " test instead of the other splits' seeds, "
        + (
            f"the column would differ for {_names(changed)}."
            if changed
            else 'the column "holds across splits" is the same.'
        )
    )
    return "\n\n".join(out) + "\n"


def level_simulation(
    splits: Sequence[int], tau: float, sd: float, n: int = 5, draws: int = 20000, seed: int = 0
) -> dict[int, dict[str, float]]:
    """How often each pooled test rejects a zero mean difference at ``alpha`` (its level), by
    simulation of this design: per draw, ``k`` splits with true differences ``N(0, tau^2)`` and
    ``n`` paired seeds each with differences ``N(true, sd^2)``. ``random_effects``: the test of
    :func:`statistics.random_effects_mean` (vectorized over draws here; tested equal to it);
    ``blocked``: the paired analysis with split as a block (``diff ~ split``, the mean of the
    split means tested with the pooled within-split variance on ``k (n - 1)`` degrees of
    freedom). Returns ``{k: {"random_effects", "blocked"}}`` rejection rates. O(draws k n)."""
    rng = np.random.default_rng(seed)
    alpha = statistics.ALPHA
    out = {}
    for k in splits:
        d = rng.normal(0.0, tau, (draws, k, 1)) + rng.normal(0.0, sd, (draws, k, n))
        y, s2 = d.mean(axis=2), d.var(axis=2, ddof=1)
        p_re = random_effects_p(y, s2 / n)
        se_b = np.sqrt(s2.mean(axis=1) / (n * k))
        p_b = 2 * stats.t.sf(np.abs(y.mean(axis=1) / se_b), k * (n - 1))
        out[k] = {
            "random_effects": float(np.mean(p_re < alpha)),
            "blocked": float(np.mean(p_b < alpha)),
        }
    return out


def random_effects_p(y: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The p-value of :func:`statistics.random_effects_mean` for each row of ``y`` / ``v``
    (``(draws, k)``, ``k >= 2``), in numpy for the simulation."""
    k = y.shape[1]
    w = 1 / v
    y_fe = (w * y).sum(1, keepdims=True) / w.sum(1, keepdims=True)
    q = (w * (y - y_fe) ** 2).sum(1)
    c = w.sum(1) - (w**2).sum(1) / w.sum(1)
    tau2 = np.maximum(0.0, (q - (k - 1)) / c)
    ws = 1 / (v + tau2[:, None])
    mu = (ws * y).sum(1) / ws.sum(1)
    scale = (ws * (y - mu[:, None]) ** 2).sum(1) / (k - 1)
    se = np.sqrt(np.maximum(1.0, scale) / ws.sum(1))
    return 2 * stats.t.sf(np.abs(mu / se), k - 1)


def split_overlap(seed: int, study_seed: int = 0) -> dict[str, dict[str, int]]:
    """How the characters of split ``study_seed`` fall into split ``seed``'s parts: ``{study
    part: {part: count}}`` for the study's 136 classes and fractions (``data.splits``'s shuffle
    depends only on the number of classes and the seed, so no data is read)."""
    labels = np.arange(STUDY_CLASSES)
    names = ("train", "val", "test")
    a = class_disjoint_split(labels, STUDY_FRACTIONS, study_seed)
    b = class_disjoint_split(labels, STUDY_FRACTIONS, seed)
    return {
        na: {nb: len(np.intersect1d(pa, pb)) for nb, pb in zip(names, b)}
        for na, pa in zip(names, a)
    }


def _study_summary(docs: Path, claim: str | None = None) -> Path:
    """The split-0 ``summary.json`` that the split steps re-run: ``DOCS/tuned`` (the methods,
    steps ``seed<k>``) or ``DOCS/claims/<claim>`` (steps ``claims<k>/<claim>``)."""
    return docs / ("tuned" if claim is None else f"claims/{claim}") / "summary.json"


def _compute_rows(docs: Path) -> tuple[list[str], list[str]]:
    """The compute table's rows (published steps) and the steps not finished: not published
    yet, or published with fewer rows than the split-0 comparison they re-run (a ``compare
    --methods`` subset; the missing rows are named, never counted as finished)."""
    rows, missing = [], []
    for step in SPLIT_STEPS:
        folders = (
            [docs / "splits" / step]
            if not step.startswith("claims")
            else [docs / "splits" / step / c for c in SPLIT_CLAIMS]
        )
        for folder in folders:
            path = folder / "summary.json"
            name = str(folder.relative_to(docs / "splits"))
            if not path.is_file():
                missing.append(name)
                continue
            s = json.loads(path.read_text())
            runs = sum(r.get("n_runs", 0) for r in s["rows"].values())
            failed = sum(r.get("n_failed", 0) for r in s["rows"].values())
            secs = sum(sum(r["seconds"]["values"]) for r in s["rows"].values())
            shape = f"{len(s['rows'])} x {s['seeds']}"
            claim = folder.name if step.startswith("claims") else None
            counterpart = _study_summary(docs, claim)
            if counterpart.is_file():
                wanted = list(json.loads(counterpart.read_text())["rows"])
                absent = [r for r in wanted if r not in s["rows"]]
                if absent:
                    shape = f"{len(wanted) - len(absent)} of {len(wanted)} x {s['seeds']}"
                    missing.append(f"{name} (not run yet: {', '.join(absent)})")
            rows.append(
                f"| {name} | {step.removeprefix('claims').removeprefix('seed')} | {shape} |"
                f" {runs} ({failed} failed) | {secs:,.0f} | {s['total_wall_seconds']:,.0f} |"
                f" {s.get('jobs', '-')} |"
            )
    return rows, missing


def splits_compute_markdown(docs: Path) -> str:
    """Compute and wall time of the published split steps, the ones still missing, and the
    command that resumes them."""
    rows, missing = _compute_rows(docs)
    lines = [
        "| step | split seed | rows x seeds | runs | run seconds | command wall (s) | jobs |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Read from each step's `summary.json` (`docs/study/splits/<step>/`): run seconds are the"
        " runs' own wall seconds summed (two at a time with `--jobs 2`), the command wall the"
        " `compare` commands' (a `--resume` adds its own).",
        "",
        (
            f"**Not finished when this was generated:** {', '.join(missing)}."
            if missing
            else "**Every step has finished.**"
        )
        + " Resume (or run) the steps with the same command; each is resumable and publishes"
        " its outputs to `docs/study/splits/<step>/` when it finishes; then regenerate this page's"
        " generated sections:",
        "",
        "```bash",
        f"{RESUME_COMMAND}                 # every step: {' '.join(SPLIT_STEPS)}",
        f"{RESUME_COMMAND} seed3           # chosen steps only",
        REPORT_COMMAND,
        "```",
    ]
    return "\n".join(lines) + "\n"


def load_split_summaries(docs: Path) -> tuple[dict[int, dict], dict[str, dict[int, dict]]]:
    """``(methods, claims)``: the tuned comparison's ``summary.json`` per split seed (split 0:
    ``DOCS/tuned``, split k: ``DOCS/splits/seed<k>``) and, per decided claim, its summaries
    (split 0: ``DOCS/claims/<claim>``, split k: ``DOCS/splits/claims<k>/<claim>``); only
    finished comparisons (those that wrote ``summary.json``)."""

    def read(path: Path, seed: int) -> dict:
        summary = json.loads(path.read_text())
        split_seed(summary, str(path), seed)
        return summary

    def seed_of(folder: Path, prefix: str) -> int | None:
        tail = folder.name[len(prefix) :]
        return int(tail) if folder.name.startswith(prefix) and tail.isdigit() else None

    methods = {0: read(_study_summary(docs), 0)}
    found = [(seed_of(f, "seed"), f) for f in (docs / "splits").glob("seed*")]
    for k, folder in sorted((k, f) for k, f in found if k is not None):
        if (folder / "summary.json").is_file():
            methods[k] = read(folder / "summary.json", k)
    claims: dict[str, dict[int, dict]] = {}
    for claim in SPLIT_CLAIMS:
        if _study_summary(docs, claim).is_file():
            claims[claim] = {0: read(_study_summary(docs, claim), 0)}
        found = [(seed_of(f, "claims"), f) for f in (docs / "splits").glob("claims*")]
        for k, folder in sorted((k, f) for k, f in found if k is not None):
            if claim in claims and (folder / claim / "summary.json").is_file():
                claims[claim][k] = read(folder / claim / "summary.json", k)
    return methods, claims


SPLITS_TEXT = """\
**How to read it.** Each split's cell is the paired difference against {reference} on that split's
seeds (mean ± 95% CI, `*`: the interval excludes 0) and its verdict, by the rules of the study's
tables (Holm over the table's rows within the split, TOST against ±1.0 point, MDD); split 0 is
the study's (10 seeds, the verdicts of the table below), splits 1-3 are other class-disjoint
68 / 34 / 34 partitions of the same 136 characters (`split.class_disjoint_split.seed` = k,
recorded in each `summary.json`), each run with every method's tuned setting on 5 paired seeds
(1-5: within a split, seed s of every method shares its initial weights and batch order). The
reference was chosen on split 0's test results; on the other splits it is fixed in advance.

**The pooled test is a random-effects mean over the splits**, not a paired analysis with split
as a block: the question is whether a verdict survives *another* partition of the characters, so
the split is a random draw from the possible partitions and the effect may differ between them
(the held-out-alphabets check of issue 42 moved plugin FastAP's gap from -6.56 to -0.57). A
blocked (fixed-effect) analysis would test the average over these particular splits with the seed
noise alone and call a gap that exists on one split only "significant". Per split, the mean
paired difference and its variance s² / n enter a DerSimonian-Laird random-effects mean; with 2-4
splits the between-split variance τ² is poorly estimated, so the interval and test use the
Hartung-Knapp-Sidik-Jonkman variance (modified: never narrower than the DerSimonian-Laird one)
with a t distribution on k - 1 degrees of freedom (`reporting.statistics.random_effects_mean`).
The price is power: with 2 splits (1 degree of freedom, t = 12.7) almost nothing can hold, with 4
a consistent gap of a few points can. τ (points) is the estimated spread of the true difference
between splits.

{level}
The blocked test keeps its level only when the splits share one true difference; with a
spread between splits it calls a zero mean difference significant far more often than 5%, the
random-effects test stays at or below 5% (conservative with 2-3 splits).

Split 0 enters the pooled test with {pooled_seeds}:
every split then counts with one design, and the split on which the settings were tuned and the
reference chosen (where its gaps are favoured by that selection) does not weigh twice (once
another split has finished, the sentences under the table say whether all its seeds would change
the column). "Holds across splits": the
same direction on every split and the pooled test significant after Holm over the table's rows.

**Caveat: the tuned settings were chosen on split 0's validation classes, which are partly test
classes in the other splits** (hyperparameters carry over, never weights: every run trains from
scratch on its split's training characters). {overlap} A tuned setting can thus look better on a
split whose test characters it was tuned on; the partitions share characters in every part, so
the splits are not independent samples of characters either.
"""


def level_markdown(report: dict, splits: Sequence[int] = (2, 3, 4)) -> str:
    """The level of the two pooled tests (:func:`level_simulation`) at this design's spread:
    the median over the rows of the study split's paired standard deviation, 5 seeds."""
    sd = float(np.median([r["splits"]["0"]["std"] for r in report["rows"].values()]))
    none, some = level_simulation(splits, 0.0, sd), level_simulation(splits, sd, sd)
    lines = [
        "| splits | τ = 0: random effects | τ = 0: blocked | τ = s: random effects |"
        " τ = s: blocked |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in splits:
        cells = [none[k]["random_effects"], none[k]["blocked"]]
        cells += [some[k]["random_effects"], some[k]["blocked"]]
        lines.append(f"| {k} | " + " | ".join(f"{100 * c:.1f}%" for c in cells) + " |")
    return (
        "How often each pooled test rejects a true mean difference of 0 at the 5% level, in a"
        " simulation of this design (`level_simulation` in `scripts/study_report.py`: 5 paired"
        f" seeds per split, paired standard deviation s = {100 * sd:.2f} points, the median of"
        " split 0's rows; 20,000 draws, seed 0), with no spread of the true difference between"
        " splits (τ = 0) and with a spread as large as the seed noise (τ = s):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def splits_markdown(docs: Path) -> dict[str, str]:
    """The generated sections of the results page: ``{"methods", "claims", "compute"}``."""
    methods, claims = load_split_summaries(docs)
    reference = json.loads((docs / "tuned" / "vs_best.json").read_text())["reference"]
    report = across_splits(methods, reference)
    overlap = " ".join(
        f"Split {k}'s 34 test characters hold {o['val']['test']} of split 0's validation"
        f" characters and {o['test']['test']} of its test characters."
        for k in sorted(set(list(methods)[1:]) | PLANNED_SPLITS)
        for o in [split_overlap(k)]
    )
    methods_md = (
        across_splits_table(report, "method")
        + "\n"
        + across_splits_sentences(report, "method")
        + "\n"
        + SPLITS_TEXT.format(
            reference=reference,
            overlap=overlap,
            pooled_seeds=(
                f"seeds {_seed_range(report['pooled_run_ids']['0'])}, the seeds the other splits"
                " ran"
                if len(report["splits"]) > 1
                else "the seeds the other splits run (1-5 in `scripts/run_splits.sh`)"
            ),
            level=level_markdown(report),
        )
    )
    parts, claim_reports = [], {}
    for claim, summaries in claims.items():
        ref = summaries[0]["reference"]
        claim_reports[claim] = rep = across_splits(summaries, ref)
        parts += [
            f"#### {claim} (reference: {ref})",
            "",
            across_splits_table(rep, "setting"),
            across_splits_sentences(rep, "setting"),
        ]
    claims_md = "\n".join(parts) + (
        "\nSame form as the methods' table: split 0 from `docs/study/claims/<claim>/` (10 seeds),"
        " split k from `docs/study/splits/claims<k>/<claim>/` (5 seeds); Holm over the claim's"
        " rows within a split and over its rows for the pooled test.\n"
    )
    return {
        "methods": methods_md,
        "claims": claims_md,
        "compute": splits_compute_markdown(docs),
        "report": {"methods": report, "claims": claim_reports},
    }


def region_markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated by scripts/study_report.py splits: {name} (do not edit by hand) -->",
        f"<!-- end of generated: {name} -->",
    )


def fill_regions(page: str, sections: dict[str, str]) -> str:
    """``page`` with the text between each section's :func:`region_markers` replaced by the
    section; a section whose markers are missing (or out of order) raises ValueError."""
    for name, text in sections.items():
        begin, end = region_markers(name)
        i, j = page.find(begin), page.find(end)
        if i < 0 or j < i:
            raise ValueError(f"the page has no region {begin!r} ... {end!r}")
        page = page[: i + len(begin)] + "\n\n" + text.rstrip("\n") + "\n\n" + page[j:]
    return page


def splits_main(docs: str, page: str) -> int:
    """Write ``DOCS/splits/robustness.json`` and ``.md`` and refresh the generated regions of
    the results page ``page``."""
    sections = splits_markdown(Path(docs))
    report = sections.pop("report")
    target = Path(docs) / "splits"
    target.mkdir(parents=True, exist_ok=True)
    (target / "robustness.json").write_text(json.dumps(report, indent=2))
    (target / "robustness.md").write_text("\n".join(f"## {k}\n\n{v}" for k, v in sections.items()))
    Path(page).write_text(fill_regions(Path(page).read_text(), sections))
    print(sections["methods"], end="")
    return 0


def main(out: str, docs: str) -> int:
    claims = claims_markdown(Path(out))
    if claims is not None:
        Path(docs).mkdir(parents=True, exist_ok=True)
        (Path(docs) / "claims.md").write_text(claims)
    for phase in ("tuned", "defaults"):  # the budget's fit to each phase's settings
        folder = Path(out) / phase
        if (folder / "summary.json").is_file() and load_curves(folder, PRIMARY):
            check = convergence_check(folder)
            (Path(docs) / phase).mkdir(parents=True, exist_ok=True)
            (Path(docs) / phase / "convergence.json").write_text(json.dumps(check, indent=2))
            (Path(docs) / phase / "convergence.md").write_text(convergence_check_markdown(check))
    phases = ["tuned", "defaults"] + [
        f"claims/{p.name}" for p in sorted((Path(out) / "claims").glob("*")) if p.is_dir()
    ]
    times = {
        p: wall_time(Path(out) / p) for p in phases if (Path(out) / p / "summary.json").is_file()
    }
    if times:
        Path(docs).mkdir(parents=True, exist_ok=True)
        (Path(docs) / "wall_time.json").write_text(json.dumps(times, indent=2))
        (Path(docs) / "wall_time.md").write_text(wall_time_markdown(times))
    for phase in ("tuned", "defaults"):
        if (Path(out) / phase / "summary.json").is_file():  # the phase finished
            summary = vs_best(Path(out) / phase)
            target = Path(docs) / phase
            target.mkdir(parents=True, exist_ok=True)
            (target / "vs_best.json").write_text(json.dumps(summary, indent=2))
            (target / "vs_best.md").write_text(vs_best_markdown(summary, phase))
    if (Path(out) / "tune" / "tune.db").is_file():
        target = Path(docs) / "tune"
        target.mkdir(parents=True, exist_ok=True)
        (target / "progress.md").write_text(tune_progress(Path(out)))
    # both phases finished (compare writes summary.json last): no gain from a half-run phase
    if all((Path(out) / p / "summary.json").is_file() for p in ("tuned", "defaults")):
        gain = tuning_gain(Path(out) / "tuned", Path(out) / "defaults")
        Path(docs).mkdir(parents=True, exist_ok=True)
        (Path(docs) / "tuning_gain.json").write_text(json.dumps(gain, indent=2))
        (Path(docs) / "tuning_gain.md").write_text(tuning_gain_markdown(gain))
    probe = Path(out) / "probe"
    curves = load_curves(probe, "mean_average_precision_at_r")
    if not curves:
        print(f"study_report: no finished probe runs under {probe}", file=sys.stderr)
        return 1
    report = convergence(curves)
    target = Path(docs) / "probe"
    target.mkdir(parents=True, exist_ok=True)
    (target / "convergence.json").write_text(json.dumps(report, indent=2))
    (target / "convergence.md").write_text(markdown(report))
    plot(curves, report, target / "probe_curves.png")
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["splits"]:  # study_report.py splits DOCS PAGE
        sys.exit(splits_main(*sys.argv[2:4]))
    sys.exit(main(*sys.argv[1:3]))
