"""statistics.random_effects_mean against the DerSimonian-Laird / Hartung-Knapp formulas written
out here in numpy, and against statsmodels' combine_effects where it applies (tau^2 > 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.meta_analysis import combine_effects

from pml_rank_plugins.reporting import statistics as st


def dl_hksj_by_hand(y, v, confidence=0.95):
    """DerSimonian-Laird tau^2 (truncated at 0), random-effects mean, modified HKSJ se, t test."""
    y, v = np.asarray(y, float), np.asarray(v, float)
    k = len(y)
    w = 1 / v
    y_fe = (w * y).sum() / w.sum()
    q = (w * (y - y_fe) ** 2).sum()
    c = w.sum() - (w**2).sum() / w.sum()
    tau2 = max(0.0, (q - (k - 1)) / c)
    ws = 1 / (v + tau2)
    mu = (ws * y).sum() / ws.sum()
    scale = (ws * (y - mu) ** 2).sum() / (k - 1)
    se = math.sqrt(max(1.0, scale) / ws.sum())
    half = stats.t.ppf(0.5 + confidence / 2, k - 1) * se
    p = 2 * stats.t.sf(abs(mu / se), k - 1)
    return {"mean": mu, "se": se, "half": half, "p": p, "tau2": tau2, "q": q, "scale": scale}


HETEROGENEOUS = ([-0.066, -0.006, -0.04, -0.03], [1e-4, 5e-4, 1.2e-4, 2e-5])


def test_heterogeneous_estimates_match_the_formulas_and_statsmodels():
    y, v = HETEROGENEOUS
    got = st.random_effects_mean(y, v)
    ref = dl_hksj_by_hand(y, v)
    assert ref["tau2"] > 0 and ref["scale"] > 1  # the case the plain HKSJ also covers
    assert got["k"] == 4 and got["df"] == 3
    assert got["tau2"] == pytest.approx(ref["tau2"], rel=1e-10)
    assert got["mean"] == pytest.approx(ref["mean"], rel=1e-10)
    assert got["se"] == pytest.approx(ref["se"], rel=1e-10)
    assert got["ci_half_width"] == pytest.approx(ref["half"], rel=1e-10)
    assert got["ci_low"] == pytest.approx(ref["mean"] - ref["half"], rel=1e-10)
    assert got["p"] == pytest.approx(ref["p"], rel=1e-8)
    assert got["q_cochran"] == pytest.approx(ref["q"], rel=1e-10)
    sm = combine_effects(np.array(y), np.array(v), method_re="dl")  # untruncated, > 0 here
    assert got["mean"] == pytest.approx(sm.mean_effect_re, rel=1e-10)
    assert got["se"] == pytest.approx(math.sqrt(sm.var_hksj_re), rel=1e-10)
    assert got["i2"] == pytest.approx(sm.i2, rel=1e-10)


def test_agreeing_estimates_truncate_tau2_and_keep_the_interval_no_narrower_than_dl():
    y, v = [0.020, 0.0201, 0.0199], [1e-4, 2e-4, 1.5e-4]  # Q far below k - 1
    got = st.random_effects_mean(y, v)
    ref = dl_hksj_by_hand(y, v)
    assert got["tau2"] == 0.0 and ref["scale"] < 1
    # modified HKSJ: max(1, q) = 1, so se is the fixed-effect (= DL with tau^2 = 0) se
    se_fe = math.sqrt(1 / sum(1 / np.array(v)))
    assert got["se"] == pytest.approx(se_fe, rel=1e-12) and got["se"] == pytest.approx(ref["se"])
    assert got["mean"] == pytest.approx(got["mean_fixed"], rel=1e-12)
    assert got["i2"] == 0.0
    assert got["p"] == pytest.approx(2 * stats.t.sf(abs(got["mean"] / se_fe), 2), rel=1e-10)


def test_one_estimate_gives_no_interval_and_bad_input_is_refused():
    one = st.random_effects_mean([0.5], [0.01])
    assert one["k"] == 1 and one["mean"] == 0.5 and one["p"] is None and one["se"] is None
    with pytest.raises(ValueError, match="variances finite and positive"):
        st.random_effects_mean([0.1, 0.2], [0.01, 0.0])
    with pytest.raises(ValueError, match="variances finite and positive"):
        st.random_effects_mean([0.1, float("nan")], [0.01, 0.01])
    with pytest.raises(ValueError, match="one length"):
        st.random_effects_mean([0.1, 0.2], [0.01])
