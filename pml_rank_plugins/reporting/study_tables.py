"""The tables of a study's phases (tune, tuned, defaults, claims), from its run folders and
Optuna storage; the Omniglot study's ``docs/study`` pages (``scripts/study_report.py OUT DOCS``
calls :func:`write_study_tables`).

Tuning progress (``DOCS/tune/progress.md``), read from ``OUT/tune/tune.db`` while the studies
run (``tune.json`` is written only when every method is done): per method, trials by state, the
best validation value, its trial and parameters, and the epochs trained (each trial's last
reported epoch, summed).

The convergence probe (``DOCS/probe/convergence.json``, ``convergence.md``, ``probe_curves.png``)
and the budget's fit to each phase (``DOCS/<phase>/convergence.md``): :mod:`.convergence`.

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

import numpy as np
import optuna

from ..running.study import is_interrupted
from . import statistics
from .convergence import (
    PRIMARY,
    convergence,
    convergence_check,
    convergence_check_markdown,
    load_curves,
    markdown,
    plot,
)
from .summary import load_run_dirs, summarize_dir
from .tables import markdown_table, metric_label, test_metrics


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


def write_study_tables(out: str | Path, docs: str | Path) -> int:
    """Write every table of the module docstring whose phase has its inputs under ``out`` into
    ``docs``; returns 1 (with a line on stderr) when ``out/probe`` has no finished run, else 0."""
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
