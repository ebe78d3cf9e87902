"""reporting.across_splits: the per-split and pooled (random-effects, Holm) verdicts from synthetic
summary.json files, checked against the formulas written out."""

from __future__ import annotations

import numpy as np
import pytest

from pml_rank_plugins.reporting import across_splits
from pml_rank_plugins.reporting import statistics as st
from pml_rank_plugins.reporting.summary import summarize
from tests.reporting.split_summaries import (
    PRIMARY,
    dl_hksj,
    split_results,
    split_summary,
    synthetic_splits,
)
from tests.reporting.statsmodels_holm import holm_by_statsmodels


def test_across_splits_pools_the_splits_and_tells_what_holds(tmp_path):
    values = synthetic_splits(np.random.default_rng(4))
    summaries = {s: split_summary(v, s) for s, v in values.items()}
    report = across_splits.across_splits(summaries, "ref")
    assert list(report["rows"]) == ["first", "A", "B", "C"]
    assert report["splits"]["0"]["n_seeds"] == 10 and report["splits"]["3"]["n_seeds"] == 5
    # split 0 pools seeds 1-5 (the other splits' seeds); its verdict uses all 10
    assert report["pooled_run_ids"]["0"] == [f"seed{i}" for i in range(1, 6)]
    pooled = {}
    for name in ("first", "A", "B", "C"):
        y, v = [], []
        for vals in values.values():
            d = np.array(vals[name][:5]) - np.array(vals["ref"][:5])
            y.append(d.mean())
            v.append(d.var(ddof=1) / 5)
        pooled[name] = dl_hksj(np.array(y), np.array(v))
    for name, (mu, half, p) in pooled.items():
        got = report["rows"][name]["pooled"]
        assert got["mean"] == pytest.approx(mu, rel=1e-10)
        assert got["ci_half_width"] == pytest.approx(half, rel=1e-9)
        assert got["p"] == pytest.approx(p, rel=1e-8)
    names = list(pooled)
    holm = holm_by_statsmodels([pooled[n][2] for n in names])
    for name, adjusted in zip(names, holm):
        assert report["rows"][name]["pooled"]["p_holm"] == pytest.approx(adjusted, rel=1e-9)
    a, b, c = (report["rows"][n] for n in "ABC")
    assert a["holds"] is True and a["same_direction"] and a["pooled"]["mean"] < 0
    assert b["holds"] is False and not b["same_direction"]
    assert b["splits"]["0"]["mean"] > 0 and b["splits"]["1"]["mean"] < 0
    assert c["holds"] is False
    # the split-0 verdict is the study's: every seed, Holm over that split's table
    study = summarize(split_results(values[0]), reference="ref", primary=PRIMARY, margin=1.0)
    for name in ("A", "B", "C"):
        expected = study["differences"][name][PRIMARY]
        assert (
            a is not None and report["rows"][name]["splits"]["0"]["verdict"] == expected["verdict"]
        )
        assert report["rows"][name]["splits"]["0"]["n"] == 10
    assert b["splits"]["0"]["verdict"] == "higher" and a["splits"]["2"]["verdict"] == "lower"
    table = across_splits.across_splits_table(report, "method")
    row_a = next(line for line in table.splitlines() if line.startswith("| A |"))
    row_b = next(line for line in table.splitlines() if line.startswith("| B |"))
    assert row_a.endswith("| **yes (lower)** |")
    assert row_b.endswith("| no: direction differs (0 +, 1 -, 2 -, 3 -) |")
    assert "split 0 (study), n = 10" in table and "split 3, n = 5" in table
    text = across_splits.across_splits_sentences(report, "method")
    assert "**Holds across splits 0, 1, 2 and 3:** first and A score lower than ref" in text
    assert "B (higher on split 0)" in text and "**Split-specific:**" in text


def test_split_specific_names_the_other_splits_that_decided_the_same_direction():
    # D trails by about 5 points on both splits, each split's test decides "lower", but the
    # pooled test over two splits (1 degree of freedom) is not significant: the sentence says
    # the direction was decided on split 1 too; E is lower on split 0 only.
    rng = np.random.default_rng(7)
    values = {}
    for split, n in ((0, 10), (1, 5)):
        ref = 0.70 + 0.02 * rng.standard_normal(n)
        values[split] = {
            "ref": list(ref),
            "D": list(ref - 0.05 + 0.02 * rng.standard_normal(n)),
            "E": list(ref - (0.05 if split == 0 else 0.0) + 0.005 * rng.standard_normal(n)),
        }
    report = across_splits.across_splits({s: split_summary(v, s) for s, v in values.items()}, "ref")
    d, e = report["rows"]["D"], report["rows"]["E"]
    assert d["splits"]["0"]["verdict"] == "lower" and d["splits"]["1"]["verdict"] == "lower"
    assert d["holds"] is False and d["pooled"]["p_holm"] >= 0.05
    assert e["splits"]["0"]["verdict"] == "lower" and e["splits"]["1"]["verdict"] != "lower"
    text = across_splits.across_splits_sentences(report, "setting")
    assert (
        "**Split-specific:** D (lower on split 0; also lower on split 1) and E (lower on split 0):"
        in text
    )
    # F trails on both splits, decided on split 0 only: the shared sign is named, no verdict
    values[0]["F"] = list(np.array(values[0]["ref"]) - 0.05 + 0.005 * rng.standard_normal(10))
    values[1]["F"] = list(np.array(values[1]["ref"]) - 0.01 + 0.03 * np.array([1, -1, 1, -1, 0]))
    report = across_splits.across_splits({s: split_summary(v, s) for s, v in values.items()}, "ref")
    f = report["rows"]["F"]
    assert f["splits"]["0"]["verdict"] == "lower" and f["splits"]["1"]["verdict"] != "lower"
    assert f["same_direction"] and not f["holds"]
    text = across_splits.across_splits_sentences(report, "setting")
    assert "F (lower on split 0; the same sign on every split)" in text


def test_across_splits_with_the_study_split_alone_tests_nothing():
    values = synthetic_splits(np.random.default_rng(5))
    report = across_splits.across_splits({0: split_summary(values[0], 0)}, "ref")
    assert all(r["pooled"] is None and r["holds"] is False for r in report["rows"].values())
    text = across_splits.across_splits_sentences(report, "method")
    assert text.startswith("Only split 0 has finished")
    assert "not tested" in across_splits.across_splits_table(report, "method")


def test_a_summary_recording_another_split_is_refused():
    values = synthetic_splits(np.random.default_rng(6))
    summary = split_summary(values[2], 2)
    assert across_splits.split_seed(summary, "x/seed2/summary.json", 2) == 2
    with pytest.raises(
        ValueError, match=r"x/seed1/summary.json: records .*seed = \[2\], expected 1"
    ):
        across_splits.split_seed(summary, "x/seed1/summary.json", 1)


def test_the_simulations_pooled_test_is_random_effects_mean():
    rng = np.random.default_rng(8)
    y, v = rng.normal(0, 0.03, (6, 3)), rng.uniform(1e-5, 4e-4, (6, 3))
    got = across_splits.random_effects_p(y, v)
    for i in range(6):
        assert got[i] == pytest.approx(st.random_effects_mean(y[i], v[i])["p"], rel=1e-9)


def test_level_simulation_shows_the_blocked_test_overrejecting_under_heterogeneity():
    level = across_splits.level_simulation([3], tau=0.02, sd=0.02, draws=2000, seed=1)
    assert level[3]["blocked"] > 0.2 and level[3]["random_effects"] < 0.07
    calm = across_splits.level_simulation([3], tau=0.0, sd=0.02, draws=2000, seed=1)
    assert abs(calm[3]["blocked"] - 0.05) < 0.02  # the blocked test is exact without a spread
