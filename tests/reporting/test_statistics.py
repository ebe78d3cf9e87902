"""Statistics of comparisons against hand-computed and published values."""

from __future__ import annotations

import math

import pytest

from pml_rank_plugins.reporting import statistics as st

# Student's sleep data (Cushny & Peebles 1905; R's `sleep`): extra hours of sleep of 10 patients
# under two drugs. R: t.test(extra ~ group, data = sleep, paired = TRUE) prints
# t = -4.0621, df = 9, p-value = 0.002833, 95% CI [-2.4598858, -0.7001142], mean diff -1.58.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_test_matches_published_sleep_example():
    d = st.paired_difference(DRUG1, DRUG2)
    assert d["n"] == 10
    assert d["mean"] == pytest.approx(-1.58, abs=1e-12)
    assert d["t"] == pytest.approx(-4.0621, abs=5e-5)
    assert d["p_ttest"] == pytest.approx(0.002833, abs=5e-7)
    assert d["ci_low"] == pytest.approx(-2.4598858, abs=5e-8)
    assert d["ci_high"] == pytest.approx(-0.7001142, abs=5e-8)
    assert d["ci_excludes_zero"] is True
    # The t statistic by hand: mean(d) / (sd(d) / sqrt(n)).
    diffs = [a - b for a, b in zip(DRUG1, DRUG2)]
    mean = sum(diffs) / 10
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 9)
    assert d["t"] == pytest.approx(mean / (sd / math.sqrt(10)), rel=1e-12)
    assert d["std"] == pytest.approx(sd, rel=1e-12)


def test_wilcoxon_exact_p_for_six_positive_differences():
    # Six distinct positive differences: W- = 0 is the most extreme of 2^6 equally likely sign
    # patterns on each side, so the exact two-sided p is 2 / 64.
    a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    b = [0.9, 1.8, 2.7, 3.6, 4.5, 5.4]
    d = st.paired_difference(a, b)
    assert d["p_wilcoxon"] == pytest.approx(2 / 64, abs=1e-12)
    # Below 6 pairs no Wilcoxon p is reported.
    assert st.paired_difference(a[:5], b[:5])["p_wilcoxon"] is None


def test_two_runs_use_t_with_one_degree_of_freedom():
    s = st.t_interval([0.5, 0.7])
    # sd = 0.1 * sqrt(2); half-width = t_{0.975, 1} * sd / sqrt(2) = 12.7062047 * 0.1.
    assert s["n"] == 2 and s["mean"] == pytest.approx(0.6)
    assert s["std"] == pytest.approx(0.1 * math.sqrt(2))
    assert s["ci_half_width"] == pytest.approx(1.27062047, abs=1e-8)
    assert s["ci_low"] == pytest.approx(0.6 - 1.27062047, abs=1e-8)
    assert st.format_mean_ci(s) == "60.00 ± 127.06"


def test_one_run_has_no_interval_and_never_prints_plus_minus_zero():
    s = st.t_interval([0.6146])
    assert s["n"] == 1 and s["std"] is None and s["ci_half_width"] is None
    assert st.format_mean_ci(s) == "61.46 (n=1, no CI)"
    d = st.paired_difference([0.62], [0.60])
    assert d["t"] is None and d["p_ttest"] is None and d["ci_excludes_zero"] is None
    assert st.format_difference(d) == "+2.00 (n=1, no CI)"


def test_identical_differences_give_zero_width_interval_and_no_t_test():
    d = st.paired_difference([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
    assert d["ci_half_width"] == pytest.approx(0.0, abs=1e-15)
    assert d["t"] is None and d["p_ttest"] is None  # undefined, not 0 or NaN
    same = st.paired_difference([0.5, 0.6], [0.5, 0.6])
    assert same["mean"] == 0.0 and same["ci_excludes_zero"] is False


def test_describe_runs_pairs_by_run_id():
    runs = {
        "A": {"seed0": {"m": 0.50}, "seed1": {"m": 0.60}, "seed2": {"m": 0.70}},
        # B lacks seed1 (say it failed): only seed0 and seed2 are paired.
        "B": {"seed2": {"m": 0.75}, "seed0": {"m": 0.52}},
    }
    out = st.describe_runs(runs, ["m"])
    assert out["reference"] == "A"
    assert out["stats"]["A"]["m"]["n"] == 3 and out["stats"]["B"]["m"]["n"] == 2
    d = out["differences"]["B"]["m"]
    assert d["run_ids"] == ["seed2", "seed0"]
    assert d["mean"] == pytest.approx(((0.75 - 0.70) + (0.52 - 0.50)) / 2)
    assert "A" not in out["differences"]
    flipped = st.describe_runs(runs, ["m"], reference="B")["differences"]["A"]["m"]
    assert flipped["mean"] == pytest.approx(-d["mean"])
    with pytest.raises(ValueError, match="reference 'C' is not one of"):
        st.describe_runs(runs, ["m"], reference="C")


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        st.t_interval([])
    with pytest.raises(ValueError, match="non-finite"):
        st.t_interval([0.5, float("nan")])
    with pytest.raises(ValueError, match="shapes differ"):
        st.paired_difference([1.0, 2.0], [1.0])


def test_format_marks_differences_whose_interval_excludes_zero():
    d = st.paired_difference(DRUG2, DRUG1)
    assert st.format_difference(d, scale=1.0) == "+1.58 ± 0.88 *"
    inconclusive = st.paired_difference([0.5, 0.7, 0.6], [0.6, 0.6, 0.6])
    assert not st.format_difference(inconclusive).endswith("*")
    assert st.format_p(0.002833) == "0.003" and st.format_p(1.2e-5) == "1.2e-05"
    assert st.format_p(None) == "-"
