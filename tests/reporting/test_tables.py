"""The comparison tables: the notes (time column, tests), verdicts from Holm-adjusted p-values,
TOST against a declared margin, the detectable difference, the CSV columns."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from statsmodels.stats.power import TTestPower

from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.reporting.summary import summarize
from pml_rank_plugins.reporting.tables import markdown_table, verdict, write_csv
from tests.reporting.synthetic import synthetic_results


def _after_table(text: str) -> str:
    """The lines between the first table and the next one."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if not line.startswith("| "))
    after = lines[end:]
    stop = next((i for i, line in enumerate(after) if line.startswith("| ")), len(after))
    return "\n".join(after[:stop])


def test_time_column_note_names_jobs_and_load():
    summary = summarize(synthetic_results(seeds=2))
    text = markdown_table(summary)
    assert "time/run (s)" in text.splitlines()[0]
    note = _after_table(text)
    assert "Time/run" in note and "`--jobs`" in note and "load" in note
    assert note.count("Time/run") == 1


# --------------------------------------------------------------------------- verdicts

MAPR = "mean_average_precision_at_r"
# Five reference values and a zero-mean pattern of paired differences with sd sqrt(2.5) * k.
REF5 = [0.50, 0.52, 0.49, 0.51, 0.53]
PATTERN5 = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])


def _results(ref: list[float], others: dict[str, list[float]]) -> dict:
    """``{name: {seed<i>: metrics.json}}`` with the test MAP@R only: the reference first."""
    out = {}
    for name, vals in {"ref": ref, **others}.items():
        out[name] = {f"seed{i}": {"test": {"test": {MAPR: float(v)}}} for i, v in enumerate(vals)}
    return out


def _shifted(ref, t: float, k: float = 0.002) -> list[float]:
    """``ref + d`` with d = c + PATTERN5 * k, c chosen so that the paired t statistic is ``t``:
    t = c / (sd / sqrt(5)) with sd = sqrt(2.5) k."""
    c = t * math.sqrt(2.5) * k / math.sqrt(5)
    return list(np.asarray(ref) + c + PATTERN5 * k)


def test_holm_decides_the_verdict_not_the_uncorrected_interval():
    # t = 3.2 on 4 df: two-sided p = 0.0328 (t table: t_{0.975,4} = 2.776 < 3.2 < t_{0.99,4} =
    # 3.747, so 0.02 < p < 0.05), its 95% CI excludes 0. Alone it is "higher"; next to two rows
    # with p ~ 0.7 Holm multiplies it by 3 (0.098): inconclusive, the star stays.
    row = _shifted(REF5, 3.2)
    alone = summarize(_results(REF5, {"A": row}))
    d = alone["differences"]["A"][MAPR]
    assert 0.02 < d["p_ttest"] < 0.05 and d["p_ttest_holm"] == d["p_ttest"]
    assert d["verdict"] == "higher"
    noise = {"B": _shifted(REF5, 0.4), "C": _shifted(REF5, -0.4)}
    crowded = summarize(_results(REF5, {"A": row, **noise}))
    d = crowded["differences"]["A"][MAPR]
    assert d["p_ttest_holm"] == pytest.approx(3 * d["p_ttest"], rel=1e-12)  # smallest of 3
    sd = float(np.std(PATTERN5 * 0.002, ddof=1))
    effect = TTestPower().solve_power(nobs=5, alpha=0.05, power=0.8, alternative="two-sided")
    assert d["mdd"] == pytest.approx(effect * sd, rel=1e-9)
    assert d["verdict"] == f"inconclusive (MDD {100 * effect * sd:.2f})"
    lines = [ln for ln in markdown_table(crowded).splitlines() if ln.startswith("| A | 5 |")]
    line = lines[-1]  # the differences table's row (the first is the means table's)
    assert " * |" in line and line.endswith(f"| inconclusive (MDD {100 * effect * sd:.2f}) |")


def test_equivalence_needs_a_declared_margin():
    rng = np.random.default_rng(1)
    ref = list(0.5 + 0.01 * rng.standard_normal(10))
    close = list(np.asarray(ref) + 0.002 * rng.standard_normal(10))  # |Δ| ~ 0.1 points
    results = _results(ref, {"A": close})
    none = summarize(results)
    assert none["equivalence_margin"] is None
    assert "p_tost" not in none["differences"]["A"][MAPR]
    assert none["differences"]["A"][MAPR]["verdict"].startswith("inconclusive (MDD ")
    text = markdown_table(none)
    assert "TOST" not in text.split("\n\n")[4]  # the differences table has no TOST column
    assert "No equivalence test: the config declares no `compare.equivalence_margin`" in text
    one = summarize(results, margin=1.0)
    d = one["differences"]["A"][MAPR]
    assert d["equivalence_margin"] == pytest.approx(0.01)  # 1 point = 0.01 as a fraction
    assert d["p_tost_holm"] == d["p_tost"] < 0.05 and d["verdict"] == "equivalent within ±1.0"
    text = markdown_table(one)
    assert "| TOST ±1.0 Holm |" in text and "equivalent within ±1.0 |" in text
    assert "No equivalence test" not in text
    # A margin below the noise cannot be shown: inconclusive again.
    tight = summarize(results, margin=0.05)["differences"]["A"][MAPR]
    assert tight["p_tost"] > 0.05 and tight["verdict"].startswith("inconclusive")


def test_a_real_difference_inside_the_margin_reads_both():
    ref = [0.50, 0.52, 0.49, 0.51, 0.53, 0.50, 0.48, 0.52, 0.51, 0.50]
    pattern = np.array([-1.0, 1.0] * 5) * 0.001
    results = _results(ref, {"A": list(np.asarray(ref) + 0.003 + pattern)})  # +0.3 ± 0.1 points
    d = summarize(results, margin=1.0)["differences"]["A"][MAPR]
    assert d["verdict"] == "higher, within ±1.0"
    d = summarize(results, margin=0.25)["differences"]["A"][MAPR]
    assert d["verdict"] == "higher"


def test_verdicts_without_a_test():
    one = summarize(_results([0.5], {"A": [0.6]}))["differences"]["A"][MAPR]
    assert one["verdict"] == "n=1, no test" and one["mdd"] is None
    same = summarize(_results([0.5, 0.6], {"A": [0.52, 0.62]}), margin=1.0)
    d = same["differences"]["A"][MAPR]
    assert d["verdict"] == "no test (Δ identical in every pair)" and d["p_tost"] is None
    assert verdict(None) == "-"


@pytest.mark.parametrize("bad", [0, -1.0, "1", True, float("inf")])
def test_a_bad_margin_is_a_config_error_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"compare\.equivalence_margin"):
        summarize(_results(REF5, {"A": _shifted(REF5, 1.0)}), margin=bad)


def test_csv_carries_holm_mdd_tost_and_verdict(tmp_path):
    noise = {"B": _shifted(REF5, 0.4), "C": _shifted(REF5, -0.4)}
    summary = summarize(_results(REF5, {"A": _shifted(REF5, 3.2), **noise}), margin=2.0)
    write_csv(summary, tmp_path / "c.csv")
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "c.csv"))}
    for name in ("A", "B", "C"):
        d = summary["differences"][name][MAPR]
        row = rows[name]
        assert float(row[f"{MAPR}_diff_p_ttest_holm"]) == pytest.approx(d["p_ttest_holm"], 1e-5)
        assert float(row[f"{MAPR}_diff_mdd80_pct"]) == pytest.approx(100 * d["mdd"], abs=1e-6)
        assert float(row["p_tost_holm"]) == pytest.approx(d["p_tost_holm"], rel=1e-5)
        assert row["equivalence_margin_pct"] == "2" and row["verdict"] == d["verdict"]
        assert row[f"{MAPR}_diff_p_wilcoxon_holm"] == ""  # n = 5 < 6: no Wilcoxon
    assert rows["ref"]["verdict"] == "" and rows["ref"]["p_tost"] == ""
    write_csv(summarize(_results(REF5, noise)), tmp_path / "none.csv")
    assert {r["p_tost"] for r in csv.DictReader(open(tmp_path / "none.csv"))} == {""}


def test_differences_note_states_the_family_the_power_and_the_missing_margin():
    text = markdown_table(summarize(synthetic_results(seeds=3)))
    note = text.split("in points of %:")[1]
    assert (
        "Holm-adjusted over the table's comparisons against plugin FastAP (4 for the t-test" in note
    )
    assert "detects with 80% power" in note and "two-sided α = 0.05" in note
    assert "No equivalence test" in note
    head = next(ln for ln in note.splitlines() if ln.startswith("| method | n pairs"))
    assert "| p t-test (MAP@R) | t-test Holm | p Wilcoxon (MAP@R) | Wilcoxon Holm |" in head
    assert head.endswith("| MDD (MAP@R) | MAP@R vs plugin FastAP |")
