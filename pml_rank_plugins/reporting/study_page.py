"""The report of ``pml-rank study``: ``OUT/study.md``, ``OUT/study.json`` and ``across_splits.png``.

``study.md`` leads with the verdict across the splits (the per-split and pooled differences
against the reference, :mod:`.across_splits`: random-effects mean over the splits, Holm over the
methods, "holds" when the direction is the same on every split and the pooled Holm p is below
0.05), then each split's comparison table (``compare``'s, against the same reference), the tuning
table (``tune.md``) and the compute; ``study.json`` holds the plan and every number;
``across_splits.png`` (and ``.pdf``) draws each method's paired difference per split and pooled,
with 95% intervals.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Mapping

from ..running.study_plan import TUNE_DIR, StudyPlan, format_seconds
from . import style
from .across_splits import across_splits, across_splits_sentences, across_splits_table
from .tables import markdown_table, metric_label

REPORT_FILE = "study.md"
REPORT_JSON = "study.json"
FIGURE = "across_splits.png"

CAVEATS = """\
**How to read it.** Each split's cell is the paired difference against {reference} on that
split's seeds (mean ± 95% CI, `*`: the interval excludes 0) and its verdict by the comparison
table's rules (Holm over the methods within the split, TOST against the config's
`compare.equivalence_margin` when it has one, MDD). The pooled column is a random-effects mean
over the splits (DerSimonian-Laird τ², modified Hartung-Knapp interval and t-test on
k - 1 degrees of freedom), Holm-adjusted over the methods: the splits are random draws of the
class partition, so a gap that exists on one split only does not count as shown. With 2 splits
(1 degree of freedom) almost nothing can hold; more splits (`--splits`) buy power, more seeds
(`--seeds`) narrow each split's interval.

**Caveats.** Every method was tuned with the same budget ({trials}) on split
{first}'s validation classes; on the other splits some of those classes are test classes, so a
setting can look better on a split whose test classes it was tuned on. The reference
({reference}) was fixed before any result: {reference_rule}.
"""


def study_report(plan: StudyPlan, summaries: Mapping[int, dict], seconds: Mapping) -> dict:
    """``study.json``: the plan, the across-splits report (:func:`.across_splits.across_splits`
    of ``summaries``, ``{split seed: summary.json}`` with the tuning's split first) and the
    steps' wall seconds (``{step: seconds}``, this command's)."""
    return {
        "plan": plan.to_json(),
        "across_splits": across_splits(dict(summaries), plan.reference),
        "splits": {str(s): str(Path(f"split{s}") / "summary.json") for s in summaries},
        "step_seconds": dict(seconds),
    }


def study_markdown(report: dict, summaries: Mapping[int, dict], tune_md: str) -> str:
    """``study.md`` (see the module docstring)."""
    plan, across = report["plan"], report["across_splits"]
    label = metric_label(across["primary_metric"])
    seeds = ", ".join(str(s) for s in plan["split_seeds"])
    key = f"`{plan['split_key']}` = {seeds}" if plan["split_key"] else "the config's split"
    parts = [
        f"# Study: is any method better than {plan['reference']}?",
        "",
        f"{_count(len(plan['methods']), 'method')} ({', '.join(plan['methods'])}), each tuned"
        f" with {_count(plan['trials'], 'trial')} on split {plan['split_seeds'][0]}'s validation"
        f" classes, then retrained with its tuned setting on {_count(plan['seeds'], 'paired seed')}"
        f" on each of {_count(len(plan['split_seeds']), 'class-disjoint split')} ({key}). Test"
        f" {label}, every method against {plan['reference']}.",
        "",
        "## Across splits",
        "",
        across_splits_table(across, "method"),
        across_splits_sentences(across, "method"),
        f"![paired differences per split and pooled]({FIGURE})",
        "",
        CAVEATS.format(
            reference=plan["reference"],
            trials=_count(plan["trials"], "trial"),
            first=plan["split_seeds"][0],
            reference_rule="`--reference`, else the config's first method",
        ),
    ]
    for i, (seed, summary) in enumerate(summaries.items()):
        what = " (the tuning's split)" if i == 0 else ""
        parts += [f"## Split {seed}{what}", "", f"From `split{seed}/`.", ""]
        parts += [markdown_table(summary)]
    parts += ["## Tuning", "", f"From `{TUNE_DIR}/`.", "", tune_md.rstrip("\n"), ""]
    parts += [compute_markdown(report, summaries)]
    return "\n".join(parts)


def _count(n: int, noun: str) -> str:
    """``"1 trial"``, ``"2 trials"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def compute_markdown(report: dict, summaries: Mapping[int, dict]) -> str:
    """The compute table: per step, the trainings and the wall seconds of the commands."""
    lines = [
        "## Compute",
        "",
        "| step | trainings | command wall (this call) |",
        "| --- | ---: | ---: |",
    ]
    seconds = report["step_seconds"]
    plan = report["plan"]
    tune_s = seconds.get(TUNE_DIR)
    lines.append(
        f"| {TUNE_DIR} | {len(plan['methods']) * plan['trials']} trials |"
        f" {'-' if tune_s is None else format_seconds(tune_s)} |"
    )
    for seed, summary in summaries.items():
        runs = sum(r.get("n_runs", 0) for r in summary["rows"].values())
        failed = sum(r.get("n_failed", 0) for r in summary["rows"].values())
        step_s = seconds.get(f"split{seed}")
        lines.append(
            f"| split{seed} | {runs} runs ({failed} failed) |"
            f" {'-' if step_s is None else format_seconds(step_s)} |"
        )
    lines += ["", "A `--resume` reuses finished trials and runs: its wall times are its own."]
    return "\n".join(lines) + "\n"


def across_figure(across: dict):
    """Per method (one row each), the paired difference on each split (95% CI) and the pooled
    random-effects mean (95% CI, diamond), in points; a line at 0."""
    fig = style.new_figure(8, 1.6 + 0.55 * max(1, len(across["rows"])))
    ax = fig.add_subplot()
    splits = list(across["splits"])
    names = list(across["rows"])
    series = len(splits) + 1  # the splits, then the pooled mean, top to bottom in a row
    step = 0.6 / (series - 1)
    for j, split in enumerate(splits + ["pooled"]):
        xs, ys, lo, hi = [], [], [], []
        for i, name in enumerate(names):
            row = across["rows"][name]
            d = row["pooled"] if split == "pooled" else row["splits"][split]
            if d is None or d.get("ci_low") is None or not math.isfinite(d["ci_low"]):
                continue
            xs.append(100 * d["mean"])
            ys.append(i + step * (j - (series - 1) / 2))
            lo.append(100 * (d["mean"] - d["ci_low"]))
            hi.append(100 * (d["ci_high"] - d["mean"]))
        pooled = split == "pooled"
        color = style.OKABE_ITO["black"] if pooled else style.SERIES_COLORS[j % 8]
        markers = [m for m in style.MARKERS if m != "D"]  # the diamond: the pooled mean only
        marker = "D" if pooled else markers[j % len(markers)]
        label = "pooled (random effects)" if pooled else f"split {split}"
        ax.errorbar(xs, ys, xerr=[lo, hi], fmt=marker, color=color, capsize=3, label=label)
    ax.axvline(0, color=style.GREY, linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    style.label_axes(
        ax,
        f"Paired difference against {across['reference']} per split and pooled",
        f"Δ test {metric_label(across['primary_metric'])} (points, 95% CI)",
        "method",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=10)
    return fig


def write_study_outputs(
    out_dir: Path, plan: StudyPlan, summaries: Mapping[int, dict], seconds: Mapping
) -> dict:
    """Write ``study.json``, ``study.md`` and the figure into ``out_dir``; returns the report.
    Each file is written whole (a temporary file renamed over it)."""
    report = study_report(plan, summaries, seconds)
    report["failed_runs"] = sum(
        len(s.get("failed") or []) + len(s.get("refused") or []) for s in summaries.values()
    )
    tune_md = out_dir / TUNE_DIR / "tune.md"
    tune_text = tune_md.read_text() if tune_md.is_file() else "(no tune.md)\n"
    report["figures"] = [
        str(p) for p in style.save_figure(across_figure(report["across_splits"]), out_dir / FIGURE)
    ]
    _replace(out_dir / REPORT_JSON, json.dumps(report, indent=2))
    _replace(out_dir / REPORT_FILE, study_markdown(report, summaries, tune_text))
    return report


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
