"""Statistics of comparisons against hand-computed and published values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pml_rank_plugins.reporting import statistics as st
from tests.reporting.statsmodels_holm import holm_by_statsmodels

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


# --------------------------------------------------------------------------- Holm


def _holm_loop(ps: list[float]) -> list[float]:
    """Holm (1979) from its definition: sorted ascending,
    p~_(i) = min(1, max_{j<=i} (k-j+1) p_(j))."""
    k = len(ps)
    order = sorted(range(k), key=lambda i: ps[i])
    out = [0.0] * k
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, (k - rank) * ps[i])
        out[i] = min(1.0, running)
    return out


def test_holm_by_hand():
    # Sorted: 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> raised to 0.06).
    assert st.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-15)
    # Untested comparisons (None) stay None and do not enlarge the family.
    assert st.holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
    assert st.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert st.holm([0.02]) == [0.02]  # a family of one is not adjusted
    assert st.holm([]) == [] and st.holm([None]) == [None]


def test_holm_equals_statsmodels_multipletests_with_ties_and_ones():
    rng = np.random.default_rng(5)
    families = [list(rng.uniform(0, 0.3, size=k)) for k in (1, 2, 3, 7, 12)]
    families += [[0.01, 0.01, 0.04, 0.04], [1.0, 0.5, 0.0], [0.2] * 5]
    for ps in families:
        assert st.holm(ps) == pytest.approx(holm_by_statsmodels(ps), abs=1e-15)


def test_holm_matches_the_definition_on_random_families():
    rng = np.random.default_rng(3)
    for k in (2, 5, 8):
        ps = list(rng.uniform(0, 0.2, size=k))
        assert st.holm(ps) == pytest.approx(_holm_loop(ps), abs=1e-15)


# --------------------------------------------------------------------------- TOST


def test_tost_sleep_data_by_hand_from_t_quantiles():
    # d = drug1 - drug2: mean -1.58, sd 1.229995 (R: sd(sleep$extra[1:10] - sleep$extra[11:20])),
    # se = sd / sqrt(10) = 0.388959. Lower test: t = (mean + m) / se against T_9, upper test:
    # t = (mean - m) / se. Equivalence at 5% <=> the 90% CI mean +- t_{0.95, 9} se lies inside
    # (-m, m); t_{0.95, 9} = 1.833113 (t table), so the 90% CI is [-2.293, -0.867].
    se = 1.229995 / math.sqrt(10)
    ci90 = (-1.58 - 1.833113 * se, -1.58 + 1.833113 * se)
    assert ci90[0] == pytest.approx(-2.2930, abs=5e-4)
    inside = st.tost(DRUG1, DRUG2, 2.5)  # -2.293 > -2.5: equivalent within 2.5 hours
    assert inside["p_tost_lower"] == pytest.approx(stats.t.sf((-1.58 + 2.5) / se, 9), rel=1e-5)
    assert inside["p_tost_upper"] == pytest.approx(stats.t.cdf((-1.58 - 2.5) / se, 9), rel=1e-5)
    assert inside["p_tost"] == inside["p_tost_lower"] < 0.05
    assert inside["p_tost_lower"] == pytest.approx(0.0210, abs=5e-4)  # P(T_9 > 2.3653)
    outside = st.tost(DRUG1, DRUG2, 2.2)  # -2.293 < -2.2: not shown equivalent
    assert outside["p_tost"] == pytest.approx(stats.t.sf((-1.58 + 2.2) / se, 9), rel=1e-5)
    assert outside["p_tost"] > 0.05
    assert outside["equivalence_margin"] == 2.2


def test_tost_agrees_with_the_90_percent_interval_rule():
    rng = np.random.default_rng(7)
    tq = 1.833113  # t_{0.95, 9}
    for _ in range(50):
        ref = rng.normal(0.5, 0.05, 10)
        x = ref + rng.normal(rng.uniform(-0.02, 0.02), 0.01, 10)
        d = x - ref
        half = tq * d.std(ddof=1) / math.sqrt(10)
        inside = -0.015 < d.mean() - half and d.mean() + half < 0.015
        assert (st.tost(x, ref, 0.015)["p_tost"] < 0.05) == inside


def test_tost_undefined_and_bad_margins():
    same = st.tost([0.5, 0.6], [0.4, 0.5], 0.2)  # identical differences: no t statistic
    assert same["p_tost"] is None and same["p_tost_lower"] is None
    assert st.tost([0.5], [0.4], 0.2)["p_tost"] is None  # one pair
    for bad in (0, -1.0, float("inf"), float("nan"), "1", True, None):
        with pytest.raises(ValueError, match="margin"):
            st.tost([0.5, 0.6, 0.7], [0.4, 0.6, 0.6], bad)
    with pytest.raises(ValueError, match="1-D"):
        st.tost([0.5, 0.6], [0.4], 0.1)


# --------------------------------------------------------------------------- MDD


def _power(delta: float, n: int, alpha: float = 0.05) -> float:
    """Two-sided paired t-test power from the noncentral t (scipy.stats.nct), written here."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * math.sqrt(n)
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def test_detectable_difference_solves_the_noncentral_t_power_equation():
    for n in (2, 3, 5, 10, 30):
        mdd = st.detectable_difference(n, 0.02)
        assert _power(mdd / 0.02, n) == pytest.approx(0.8, abs=1e-6), n
    # G*Power, matched pairs, two-tailed, alpha .05, power .80, n = 10: effect size dz = 0.9959.
    assert st.detectable_difference(10, 1.0) == pytest.approx(0.9959, abs=5e-4)
    # Large n: the normal approximation (z_{0.975} + z_{0.8}) / sqrt(n) = 2.8016 / sqrt(n); the
    # t-test needs slightly more (0.24% at n = 400, the t quantile's excess over z).
    large = st.detectable_difference(400, 1.0)
    assert 2.8016 / 20 < large < 1.004 * 2.8016 / 20
    assert st.detectable_difference(10, 1.0, power=0.9) > st.detectable_difference(10, 1.0)
    assert st.detectable_difference(1, 0.02) is None
    assert st.detectable_difference(5, None) is None
    assert st.detectable_difference(5, 0.0) == 0.0


def test_detectable_difference_by_simulation():
    # 20000 experiments of n = 6 pairs whose differences are N(mdd, s^2): the two-sided paired
    # t-test at 5% rejects in 80% of them (binomial sd 0.0028).
    n, s = 6, 0.013
    mdd = st.detectable_difference(n, s)
    d = np.random.default_rng(11).normal(mdd, s, size=(20000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    rejected = np.abs(t) > stats.t.ppf(0.975, n - 1)
    assert rejected.mean() == pytest.approx(0.8, abs=0.012)
    assert st.paired_difference(list(d[0]), [0.0] * n)["mdd"] == pytest.approx(
        st.detectable_difference(n, float(d[0].std(ddof=1))), rel=1e-12
    )


# --------------------------------------------------------------------------- across a table


def test_describe_runs_adjusts_each_metric_and_test_as_its_own_family():
    rng = np.random.default_rng(5)
    ref = rng.normal(0.5, 0.02, 8)
    runs = {"ref": {f"seed{i}": {"a": ref[i], "b": 0.3 + ref[i]} for i in range(8)}}
    for j, shift in enumerate((0.001, 0.01, 0.004)):
        x = ref + shift + rng.normal(0, 0.01, 8)
        runs[f"m{j}"] = {f"seed{i}": {"a": x[i], "b": 0.3 + x[i] + 0.01 * j} for i in range(8)}
    out = st.describe_runs(runs, ["a", "b"], equivalence={"a": 0.02})
    assert out["alpha"] == 0.05 and out["power"] == 0.8
    for metric in ("a", "b"):
        rows = [out["differences"][m][metric] for m in ("m0", "m1", "m2")]
        for key in ("p_ttest", "p_wilcoxon"):
            expected = _holm_loop([r[key] for r in rows])
            assert [r[f"{key}_holm"] for r in rows] == pytest.approx(expected, abs=1e-15)
    rows = [out["differences"][m]["a"] for m in ("m0", "m1", "m2")]
    assert [r["p_tost_holm"] for r in rows] == pytest.approx(
        _holm_loop([r["p_tost"] for r in rows]), abs=1e-15
    )
    assert rows[0]["equivalence_margin"] == 0.02
    assert "p_tost" not in out["differences"]["m0"]["b"]  # TOST only where a margin is given
    with pytest.raises(ValueError, match="not among the metrics"):
        st.describe_runs(runs, ["a"], equivalence={"c": 0.01})
