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
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402

from pml_rank_plugins.reporting import statistics  # noqa: E402
from pml_rank_plugins.reporting.summary import load_run_dirs, summarize_dir  # noqa: E402
from pml_rank_plugins.reporting.tables import (  # noqa: E402
    markdown_table,
    metric_label,
    test_metrics,
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
    sys.exit(main(*sys.argv[1:3]))
