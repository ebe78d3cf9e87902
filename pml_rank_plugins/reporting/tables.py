"""The comparison tables: Markdown (``comparison.md``) and CSV (``comparison.csv``), in percent.

Each row: per metric the mean +- 95% CI half-width over the runs (Student t), the number of runs
(failed ones counted), the wall time, and against the reference method the paired difference
with its 95% CI, on the primary metric the raw and Holm-adjusted p-values (paired t-test,
Wilcoxon), the Holm-adjusted TOST p-value when the config declares
``compare.equivalence_margin``, the minimum detectable difference at 80% power (MDD) and the
verdict (:func:`verdict`; all from :mod:`.statistics`). Notes under the tables say that the wall
time depends on ``--jobs`` and the machine's load, and how to read the tests.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..experiment.spec import DEFAULT_PRIMARY
from . import statistics

METRIC_LABELS = {
    "precision_at_1": "P@1",
    "r_precision": "RP",
    "mean_average_precision_at_r": "MAP@R",
}


def test_metrics(m: dict) -> dict:
    """The first test entry's metrics as they are, every further entry's prefixed by its name
    (``"separated precision_at_1"`` for the MLRC protocol, whose first entry is
    ``concatenated``; ``"test1600 recall_at_1"`` for VehicleID's three test sets)."""
    test = m.get("test") or {}
    out: dict = {}
    for i, (entry, metrics) in enumerate(test.items()):
        out.update({(k if i == 0 else f"{entry} {k}"): v for k, v in metrics.items()})
    return out


def reported_split(m: dict) -> str:
    """Where a run's ``test`` metrics come from: ``"test"``, or ``"validation"`` when its config
    evaluates no test split (``eval.test: []``) and the runner reported the best validation
    epoch's metrics instead (then ``m["test"]`` is that epoch's validation entry, value for
    value; runs of any version are recognized, nothing else is recorded)."""
    test = m.get("test") or {}
    epoch = (m.get("best") or {}).get("epoch")
    row = next((h for h in m.get("history") or [] if h.get("epoch") == epoch), None)
    if test and row is not None and test == row.get("validation"):
        return "validation"
    return "test"


def evaluated_on(runs: Iterable[dict]) -> str:
    """``"test"``, ``"validation"`` or ``"test and validation"`` over ``runs`` (metrics.json
    contents of successful runs; ``"test"`` when there are none)."""
    kinds = {reported_split(m) for m in runs}
    return " and ".join(sorted(kinds)) if len(kinds) > 1 else (kinds.pop() if kinds else "test")


def split_title(summary: Mapping) -> str:
    """``"Test"``, ``"Validation"`` or ``"Test and validation"``: what a summary's tables and
    plots show (``summary["evaluated_on"]``; ``"Test"`` for summaries written before it)."""
    return summary.get("evaluated_on", "test").capitalize()


def metric_label(metric: str) -> str:
    if " " in metric:  # a further test entry's metric (see _test_metrics)
        entry, base = metric.rsplit(" ", 1)
        return f"{entry} {metric_label(base)}"
    if metric.startswith("recall_at_"):
        return "R@" + metric[len("recall_at_") :]
    return METRIC_LABELS.get(metric, metric)


def metric_order(k: str):
    """Sort key: P@1, RP, MAP@R, then Recall@K by K, then others, then further test entries."""
    if " " in k:  # further test entries after the first entry's metrics, same order inside
        entry, base = k.rsplit(" ", 1)
        return (3, entry, metric_order(base))
    fixed = list(METRIC_LABELS)
    if k in fixed:
        return (0, fixed.index(k), 0)
    if k.startswith("recall_at_"):
        return (1, 0, int(k[len("recall_at_") :]))
    return (2, 0, 0)


def _n_cell(row: dict) -> str:
    n_refused = row.get("n_refused", 0)
    n_ok = row["n_runs"] - row["n_failed"] - n_refused
    notes = [f"{row['n_failed']} failed"] * bool(row["n_failed"])
    notes += [f"{n_refused} refused"] * bool(n_refused)
    return f"{n_ok}" + (f" ({', '.join(notes)})" if notes else "")


def markdown_table(summary: dict, label: str = "method") -> str:
    """Means with 95% CIs, then paired differences vs the reference, then failed runs."""
    metrics = summary["metrics"]
    head = [label, "n"] + [metric_label(m) for m in metrics] + ["time/run (s)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for name, row in summary["rows"].items():
        cells = [name, _n_cell(row)]
        if row["n_runs"] == row["n_failed"] + row.get("n_refused", 0):
            err = next(iter(row["failed"].values()), None)
            what = "refused" if err is None else "failed"
            err = err or next(iter(row.get("refused", {}).values()), "?")
            cells += [f"{what}: {_short(err)}"] + [""] * (len(metrics) - 1) + ["-"]
        else:
            cells += [statistics.format_mean_ci(row.get(m)) for m in metrics]
            secs = row["seconds"]["mean"]
            cells.append("-" if secs is None else f"{secs:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = summary.get("seeds")
    text = "\n".join(lines) + "\n\n"
    text += (
        f"{split_title(summary)} metrics in %, at the best validation epoch: mean ± half-width of"
        " the 95% confidence interval (Student t) over n runs"
        f"{f' (seeds, up to {seeds})' if seeds else ''}.\n"
    )
    if "validation" in summary.get("evaluated_on", "test"):
        text += (
            "\n**No test split**: a config without `eval.test` reports its best validation"
            " epoch's validation metrics, the values that chose that epoch (optimistic, not a"
            " held-out estimate); compare methods on a test split.\n"
        )
    # Fixed wording (not the run's --jobs): the table must come out the same when it is
    # recomputed from the run folders alone (summarize_dir), which do not record --jobs.
    text += "\n" + TIME_NOTE
    ref = summary.get("reference")
    diffs = summary.get("differences") or {}
    if ref is not None and diffs:
        text += differences_table(summary, label)
    for key, title in (("failed", "Failed runs"), ("refused", "Refused runs (not started)")):
        if summary.get(key):
            text += f"\n{title}:\n\n"
            for f in summary[key]:
                text += (
                    f"- {f.get(label, f.get('method'))} / {f['run_id']}: "
                    f"{_short(f['error'], 300)}\n"
                )
    return text


TIME_NOTE = (
    "Time/run: mean wall seconds per run; it depends on `--jobs` (parallel runs share the cores)"
    " and on the machine's load, so compare times only within one table.\n"
)


def differences_table(summary: dict, label: str = "method") -> str:
    """The paired-differences table against the reference and its note (Markdown)."""
    metrics = summary["metrics"]
    primary = summary.get("primary_metric", DEFAULT_PRIMARY)
    margin = summary.get("equivalence_margin")
    ref = summary["reference"]
    pl = metric_label(primary)
    head = [label, "n pairs"] + [f"Δ{metric_label(m)}" for m in metrics]
    head += [f"p t-test ({pl})", "t-test Holm", f"p Wilcoxon ({pl})", "Wilcoxon Holm"]
    if margin is not None:
        head += [f"TOST ±{_margin(margin)} Holm"]
    head += [f"MDD ({pl})", f"{pl} vs {ref}"]
    text = f"\nPaired differences vs **{ref}** (same seeds), in points of %:\n\n"
    text += "| " + " | ".join(head) + " |\n| " + " | ".join(["---"] * len(head)) + " |\n"
    diffs = summary["differences"]
    for name, row in diffs.items():
        d = row.get(primary)
        cells = [name, str(d["n"]) if d else "0"]
        cells += [statistics.format_difference(row.get(m)) for m in metrics]
        keys = ["p_ttest", "p_ttest_holm", "p_wilcoxon", "p_wilcoxon_holm"]
        keys += ["p_tost_holm"] if margin is not None else []
        cells += [statistics.format_p(d.get(k) if d else None) for k in keys]
        cells += [_points(d and d["mdd"]), verdict(d, margin)]
        text += "| " + " | ".join(cells) + " |\n"
    k = sum((row.get(primary) or {}).get("p_ttest") is not None for row in diffs.values())
    text += (
        "\nΔ = method − reference, mean ± 95% CI half-width of the paired differences; `*`: that"
        " CI excludes 0 (one comparison on its own, not corrected for the others). p: two-sided"
        " paired t-test (scipy.stats.ttest_rel) and Wilcoxon signed-rank test (only when n >= 6),"
        f" raw and Holm-adjusted over the table's comparisons against {ref} ({k} for the"
        " t-test; each test its own family; Holm's step-down, equal to statsmodels' multipletests)."
        " The verdict uses the"
        f" Holm-adjusted t-test: higher/lower when it is below {statistics.ALPHA:g}. MDD: the"
        f" smallest true difference the paired t-test detects with {statistics.POWER:.0%} power"
        " at that row's n and paired standard deviation (two-sided α ="
        f" {statistics.ALPHA:g}, uncorrected; it shrinks about as 1/√n): an inconclusive row whose MDD is larger than the differences that matter"
        " needs more seeds.\n\n"
    )
    if margin is None:
        text += (
            "No equivalence test: the config declares no `compare.equivalence_margin` (points of"
            f" {pl}), so no row can be called equivalent.\n"
        )
    else:
        text += (
            f"TOST: two one-sided paired t-tests of |Δ{pl}| >= {_margin(margin)} points (the"
            " config's `compare.equivalence_margin`); a row's p is the larger of the two (both"
            " must reject), Holm-adjusted over the table's rows like the t-test; \"equivalent"
            f' within ±{_margin(margin)}" when it is below {statistics.ALPHA:g}.\n'
        )
    return text


def verdict(d: dict | None, margin: float | None = None) -> str:
    """The primary metric's verdict from a paired-difference record of
    :func:`.statistics.describe_runs` (``margin``: the equivalence margin in points, or None).

    ``higher``/``lower`` when the Holm-adjusted t-test p is below ``alpha`` (with ``, within
    ±m`` when the Holm-adjusted TOST also passes: a real difference smaller than the margin),
    ``equivalent within ±m`` when only the TOST passes, else ``inconclusive (MDD x.xx)``; ``n=1,
    no test`` for a single pair and ``no test (Δ identical in every pair)`` for zero variance.
    """
    if not d:
        return "-"
    if d["n"] < 2:
        return f"n={d['n']}, no test"
    if d["p_ttest"] is None:
        return "no test (Δ identical in every pair)"
    alpha = statistics.ALPHA
    equivalent = margin is not None and _below(d.get("p_tost_holm"), alpha)
    if _below(d.get("p_ttest_holm"), alpha):
        direction = "higher" if d["mean"] > 0 else "lower"
        return direction + (f", within ±{_margin(margin)}" if equivalent else "")
    if equivalent:
        return f"equivalent within ±{_margin(margin)}"
    return f"inconclusive (MDD {_points(d['mdd'])})"


def _margin(margin: float) -> str:
    """The margin as declared (``1.0``, ``0.25``)."""
    return str(float(margin))


def _below(p: float | None, alpha: float) -> bool:
    return p is not None and p < alpha


def _points(x: float | None) -> str:
    """A fraction as points of %, two decimals (``"-"`` when undefined)."""
    return "-" if x is None else f"{100 * x:.2f}"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.6f}"


def _num(x: Any) -> str:
    return "" if x is None else f"{x:.6g}"


def csv_header(metrics: Sequence[str], label: str = "method") -> list[str]:
    cols = [label, "n_runs", "n_failed"]
    for m in metrics:
        cols += [
            f"{m}_mean_pct",
            f"{m}_std_pct",
            f"{m}_ci95_low_pct",
            f"{m}_ci95_high_pct",
            f"{m}_ci95_half_width_pct",
            f"{m}_diff_vs_reference_pct",
            f"{m}_diff_ci95_low_pct",
            f"{m}_diff_ci95_high_pct",
            f"{m}_diff_n_pairs",
            f"{m}_diff_p_ttest",
            f"{m}_diff_p_ttest_holm",
            f"{m}_diff_p_wilcoxon",
            f"{m}_diff_p_wilcoxon_holm",
            f"{m}_diff_mdd80_pct",
        ]
    cols += ["equivalence_margin_pct", "p_tost_lower", "p_tost_upper", "p_tost", "p_tost_holm"]
    return cols + ["verdict", "reference", "seconds_per_run", "errors"]


def write_csv(summary: dict, path: Path, label: str = "method") -> None:
    """One row per method; metric columns in percent (``_pct``), p-values as fractions. The TOST
    and verdict columns are the primary metric's; the TOST ones are empty without a margin."""
    metrics = summary["metrics"]
    primary = summary.get("primary_metric", DEFAULT_PRIMARY)
    margin = summary.get("equivalence_margin")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(csv_header(metrics, label))
        for name, row in summary["rows"].items():
            d_row = (summary.get("differences") or {}).get(name, {})
            cells = [name, row["n_runs"], row["n_failed"]]
            for m in metrics:
                st = row.get(m) or {}
                d = d_row.get(m) or {}
                cells += [
                    _pct(st.get("mean")),
                    _pct(st.get("std")),
                    _pct(st.get("ci_low")),
                    _pct(st.get("ci_high")),
                    _pct(st.get("ci_half_width")),
                    _pct(d.get("mean")),
                    _pct(d.get("ci_low")),
                    _pct(d.get("ci_high")),
                    d.get("n", ""),
                    _num(d.get("p_ttest")),
                    _num(d.get("p_ttest_holm")),
                    _num(d.get("p_wilcoxon")),
                    _num(d.get("p_wilcoxon_holm")),
                    _pct(d.get("mdd")),
                ]
            d = d_row.get(primary)
            cells.append("" if margin is None else _num(margin))
            tost = ("p_tost_lower", "p_tost_upper", "p_tost", "p_tost_holm")
            cells += [_num((d or {}).get(k)) for k in tost]
            cells.append(verdict(d, margin) if d else "")
            secs = row["seconds"]["mean"]
            errors = "; ".join(f"{r}: {e}" for r, e in row["failed"].items())
            cells += [summary.get("reference") or "", "" if secs is None else f"{secs:.2f}", errors]
            w.writerow(cells)
