"""Each column of the comparison tables holds what its header names: the metric under its label
(P@1, RP, MAP@R), and the t-test / Wilcoxon p-values (raw and Holm) of the primary metric in
their own columns, in the Markdown and in the CSV. Expected values are computed here with
scipy and statsmodels directly from the synthetic runs."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from scipy import stats

from pml_rank_plugins.reporting.summary import summarize
from pml_rank_plugins.reporting.tables import markdown_table, write_csv
from tests.reporting.statsmodels_holm import holm_by_statsmodels

MAPR, P1, RP = "mean_average_precision_at_r", "precision_at_1", "r_precision"
SEEDS = 8
REF = np.array([0.40, 0.42, 0.39, 0.41, 0.43, 0.40, 0.38, 0.42])
# Paired MAP@R differences: all positive but one (Wilcoxon and t-test disagree clearly), and a
# smaller, noisier shift.
DIFFS = {
    "A": np.array([0.010, 0.030, 0.002, 0.025, 0.015, -0.004, 0.020, 0.012]),
    "B": np.array([0.004, -0.006, 0.010, 0.002, -0.003, 0.008, 0.001, 0.006]),
}


def results() -> dict:
    """``{method: {seed<i>: metrics.json}}``: P@1 near 0.9, RP near 0.6, MAP@R near 0.4."""
    out = {}
    for name, shift in {"ref": np.zeros(SEEDS), **DIFFS}.items():
        mapr = REF + shift
        out[name] = {
            f"seed{i}": {
                "test": {"test": {P1: 0.9 + mapr[i] / 10, RP: 0.6 + mapr[i] / 10, MAPR: mapr[i]}}
            }
            for i in range(SEEDS)
        }
    return out


def table_rows(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header starts with ``| <first_header> |``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def expected_p() -> dict[str, dict[str, float]]:
    raw = {
        name: {"t": stats.ttest_rel(REF + d, REF).pvalue, "w": stats.wilcoxon(REF + d, REF).pvalue}
        for name, d in DIFFS.items()
    }
    names = list(DIFFS)
    for test in ("t", "w"):
        adjusted = holm_by_statsmodels([raw[n][test] for n in names])
        for n, p in zip(names, adjusted):
            raw[n][f"{test} holm"] = p
    return raw


def test_the_p_value_columns_hold_their_own_tests():
    want = expected_p()
    # Non-vacuous: the two tests (and raw vs Holm) give clearly different numbers here.
    for p in want.values():
        assert abs(p["t"] - p["w"]) > 0.005 and p["t"] >= 0.001 and p["w"] >= 0.001
    assert abs(want["A"]["t holm"] - want["A"]["t"]) > 0.005
    rows = table_rows(markdown_table(summarize(results(), reference="ref")), "method | n pairs")
    assert [r["method"] for r in rows] == ["A", "B"]
    for row in rows:
        p = want[row["method"]]
        assert float(row["p t-test (MAP@R)"]) == pytest.approx(p["t"], abs=5e-4)
        assert float(row["t-test Holm"]) == pytest.approx(p["t holm"], abs=5e-4)
        assert float(row["p Wilcoxon (MAP@R)"]) == pytest.approx(p["w"], abs=5e-4)
        assert float(row["Wilcoxon Holm"]) == pytest.approx(p["w holm"], abs=5e-4)


def test_the_csv_p_value_columns_hold_their_own_tests(tmp_path):
    want = expected_p()
    write_csv(summarize(results(), reference="ref"), tmp_path / "c.csv")
    with open(tmp_path / "c.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    for name in DIFFS:
        p, row = want[name], rows[name]
        assert float(row[f"{MAPR}_diff_p_ttest"]) == pytest.approx(p["t"], rel=1e-5)
        assert float(row[f"{MAPR}_diff_p_ttest_holm"]) == pytest.approx(p["t holm"], rel=1e-5)
        assert float(row[f"{MAPR}_diff_p_wilcoxon"]) == pytest.approx(p["w"], rel=1e-5)
        assert float(row[f"{MAPR}_diff_p_wilcoxon_holm"]) == pytest.approx(p["w holm"], rel=1e-5)
        assert float(row[f"{MAPR}_mean_pct"]) == pytest.approx(100 * np.mean(REF + DIFFS[name]))
        assert float(row[f"{P1}_mean_pct"]) == pytest.approx(
            100 * np.mean(0.9 + (REF + DIFFS[name]) / 10)
        )


def cell_value(cell: str) -> float:
    """The number before `` ± `` of a table cell (``"+1.38 ± 0.70*"`` -> 1.38)."""
    return float(cell.split(" ± ")[0])


def test_each_metric_sits_under_its_label():
    text = markdown_table(summarize(results(), reference="ref"))
    rows = {r["method"]: r for r in table_rows(text, "method | n")}
    head = text.splitlines()[0]
    assert head.index("P@1") < head.index("RP") < head.index("MAP@R")
    close = dict(abs=0.0051)  # two decimals of points of %
    for name, shift in {"ref": np.zeros(SEEDS), **DIFFS}.items():
        mapr = REF + shift
        for label, values in (("P@1", 0.9 + mapr / 10), ("RP", 0.6 + mapr / 10), ("MAP@R", mapr)):
            got = cell_value(rows[name][label])
            assert got == pytest.approx(100 * np.mean(values), **close), (name, label)
    diffs = {r["method"]: r for r in table_rows(text, "method | n pairs")}
    for name, d in DIFFS.items():
        assert cell_value(diffs[name]["ΔMAP@R"]) == pytest.approx(100 * np.mean(d), **close)
        assert cell_value(diffs[name]["ΔP@1"]) == pytest.approx(10 * np.mean(d), **close)
        assert cell_value(diffs[name]["ΔRP"]) == pytest.approx(10 * np.mean(d), **close)


def test_failed_and_refused_runs_are_counted_apart(tmp_path):
    runs = results()
    runs["A"]["seed8"] = {"failed": True, "error": "RuntimeError: boom"}
    runs["B"]["seed8"] = {"refused": True, "error": "RunFolderBusy: folder in use"}
    summary = summarize(runs, reference="ref")
    rows = {r["method"]: r for r in table_rows(markdown_table(summary), "method | n")}
    assert rows["A"]["n"] == "8 (1 failed)"
    assert rows["B"]["n"] == "8 (1 refused)"
    assert rows["ref"]["n"] == "8"
    write_csv(summary, tmp_path / "c.csv")
    with open(tmp_path / "c.csv", newline="") as f:
        csv_rows = {r["method"]: r for r in csv.DictReader(f)}
    assert [csv_rows[m]["n_failed"] for m in ("ref", "A", "B")] == ["0", "1", "0"]
    assert [csv_rows[m]["n_runs"] for m in ("ref", "A", "B")] == ["8", "9", "9"]
