"""Statistics for comparisons and sweeps: t intervals per method, paired tests between methods,
multiplicity correction, equivalence tests and detectable differences.

A *run* is one training run of one method, identified by a run id (``seed0``, ``seed1``, ... or
``fold0/seed0``); methods are compared on the runs they share (same seed, same fold), so the
seed-to-seed noise that every method sees alike cancels in the differences.

Per method and metric (values ``x_1..x_n``):

* mean ``m``, standard deviation ``s`` (``ddof=1``), ``n``;
* 95% confidence interval ``m +- t_{0.975, n-1} s / sqrt(n)`` (Student t, ``scipy.stats.t``);
  undefined (``None``) for ``n = 1``.

Between a method and the reference method, on the ``n`` paired runs, ``d_i = x_i - r_i``:

* mean difference, its 95% t interval as above on the ``d_i``;
* paired t-test ``t = mean(d) / (s_d / sqrt(n))``, two-sided p (``scipy.stats.ttest_rel``);
* Wilcoxon signed-rank two-sided p (``scipy.stats.wilcoxon``) when ``n >= 6`` (below 6 pairs
  its smallest possible two-sided p is 0.0625, so it can never reject at 5%);
* ``mdd``: the minimum detectable difference, the smallest true mean difference the two-sided
  paired t-test at ``alpha = 0.05`` detects with 80% power at this ``n`` and paired standard
  deviation ``s_d``: ``mdd = delta * s_d`` with ``delta`` the standardized effect size solving
  ``1 - F(t_{1-alpha/2, n-1}; n-1, delta sqrt(n)) + F(-t_{1-alpha/2, n-1}; n-1, delta sqrt(n))
  = 0.8`` (``F``: noncentral t CDF; ``statsmodels.stats.power.TTestPower.solve_power``);
* with an equivalence margin ``m > 0`` (same unit as the values): TOST, two one-sided paired
  t-tests of ``H0: mean(d) <= -m`` (``p_tost_lower``, ``ttest_rel(x, r - m,
  alternative="greater")``) and ``H0: mean(d) >= m`` (``p_tost_upper``, ``ttest_rel(x, r + m,
  alternative="less")``); ``p_tost = max(p_tost_lower, p_tost_upper)`` (intersection-union
  test: equivalence is claimed only when both one-sided tests reject, so the maximum is a level
  ``alpha`` test of ``|mean(d)| >= m`` without any correction for the two halves).

Across a table (:func:`describe_runs`), per metric, the rows' p-values against the reference form
one family and are Holm-adjusted (strong family-wise error control at ``alpha``; computed with
numpy and tested equal to ``statsmodels.stats.multitest.multipletests(method="holm")``, which
calls ``gc.collect()`` on every use: 0.2-0.7 s in a process holding torch, several times per
table): ``p_ttest_holm``, ``p_wilcoxon_holm`` and, where a
margin is given, ``p_tost_holm``, each family adjusted on its own. Rows whose raw p is undefined
are not tested and do not count in the family. Holm: with the ``k`` p-values sorted
``p_(1) <= ... <= p_(k)``, ``p~_(i) = min(1, max_{j <= i} (k - j + 1) p_(j))``.

Across independent experiments (:func:`random_effects_mean`; e.g. one paired mean difference
per class split, whose seeds are paired within a split but not across splits): the
random-effects mean with the DerSimonian-Laird between-experiment variance and the modified
Hartung-Knapp-Sidik-Jonkman interval and t-test on ``k - 1`` degrees of freedom.

Undefined quantities (``n < 2``; zero variance for the tests) are ``None``, never 0 or NaN, so
they survive JSON and cannot be mistaken for a measurement. All functions are O(n) per
comparison (Holm: O(k log k) for ``k`` rows).
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats
from statsmodels.regression.linear_model import WLS
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.power import TTestPower

CONFIDENCE = 0.95
MIN_WILCOXON = 6
ALPHA = 0.05  # level of every test and of the verdicts
POWER = 0.8  # power at which the minimum detectable difference is stated


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """Mean, std, n and the Student-t confidence interval of ``values`` (1-D, finite).

    Returns ``{"n", "mean", "std", "ci_low", "ci_high", "ci_half_width"}``; ``std`` and the
    interval are ``None`` for ``n = 1`` (no spread can be estimated from one run). A zero
    standard deviation with ``n >= 2`` gives a zero-width interval (identical runs).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"t_interval: need a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"t_interval: non-finite values {x.tolist()}")
    n = int(x.size)
    mean = float(x.mean())
    out = {"n": n, "mean": mean, "std": None, "ci_low": None, "ci_high": None}
    out["ci_half_width"] = None
    if n >= 2:
        std = float(x.std(ddof=1))
        half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * std / math.sqrt(n))
        out.update(std=std, ci_low=mean - half, ci_high=mean + half, ci_half_width=half)
    return out


def paired_difference(
    values: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> dict:
    """Paired comparison of ``values`` against ``reference`` (same length, same run order).

    Returns the :func:`t_interval` of ``d = values - reference`` plus ``t`` and ``p_ttest``
    (``scipy.stats.ttest_rel``, two-sided), ``p_wilcoxon`` (``scipy.stats.wilcoxon``, two-sided,
    only when ``n >= 6`` and some ``d != 0``), ``ci_excludes_zero`` (``None`` when there is no
    interval) and ``mdd`` (``detectable_difference`` of ``n`` and the std of ``d``). With zero
    variance of ``d`` the t-test is undefined: ``t``/``p_ttest`` are None.
    """
    a = np.asarray(values, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: shapes differ, {a.shape} vs {b.shape}")
    out = t_interval(a - b, confidence)
    out.update(t=None, p_ttest=None, p_wilcoxon=None, ci_excludes_zero=None)
    n = out["n"]
    out["mdd"] = detectable_difference(n, out["std"])
    if n >= 2:
        out["ci_excludes_zero"] = bool(out["ci_low"] > 0 or out["ci_high"] < 0)
        if out["std"] > 0:
            res = stats.ttest_rel(a, b)
            out["t"] = _finite_or_none(res.statistic)
            out["p_ttest"] = _finite_or_none(res.pvalue)
    if n >= MIN_WILCOXON and np.any(a != b):
        out["p_wilcoxon"] = _finite_or_none(stats.wilcoxon(a, b).pvalue)
    return out


def tost(values: Sequence[float], reference: Sequence[float], margin: float) -> dict:
    """Two one-sided paired t-tests of ``|mean(values - reference)| >= margin`` (TOST).

    ``margin``: positive, finite, in the values' unit. Returns ``{"equivalence_margin",
    "p_tost_lower", "p_tost_upper", "p_tost"}``: ``p_tost_lower`` tests ``H0: mean(d) <= -margin``
    (``scipy.stats.ttest_rel(values, reference - margin, alternative="greater")``),
    ``p_tost_upper`` tests ``H0: mean(d) >= margin`` (``alternative="less"`` against
    ``reference + margin``) and ``p_tost`` is their maximum (intersection-union: equivalence at
    level ``alpha`` when ``p_tost < alpha``). The p-values are ``None`` for ``n < 2`` or a zero
    variance of ``d`` (the t statistics are undefined). O(n).
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise ValueError(f"tost: margin must be a number, got {margin!r}")
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"tost: margin must be positive and finite, got {margin!r}")
    a = np.asarray(values, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"tost: need two 1-D sequences of one length, got {a.shape} vs {b.shape}")
    out = {"equivalence_margin": float(margin), "p_tost_lower": None, "p_tost_upper": None}
    out["p_tost"] = None
    d = a - b
    if d.size >= 2 and d.std(ddof=1) > 0:
        lower = stats.ttest_rel(a, b - margin, alternative="greater").pvalue
        upper = stats.ttest_rel(a, b + margin, alternative="less").pvalue
        out.update(p_tost_lower=_finite_or_none(lower), p_tost_upper=_finite_or_none(upper))
        if out["p_tost_lower"] is not None and out["p_tost_upper"] is not None:
            out["p_tost"] = max(out["p_tost_lower"], out["p_tost_upper"])
    return out


@functools.lru_cache(maxsize=None)
def _effect_size(n: int, alpha: float, power: float) -> float:
    """Standardized paired effect ``delta`` the two-sided t-test detects with ``power`` (n >= 2)."""
    return float(
        TTestPower().solve_power(
            effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided"
        )
    )


def detectable_difference(
    n: int, std: float | None, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """Minimum detectable difference (MDD) of a two-sided paired t-test: ``delta(n) * std``.

    ``delta(n)`` solves the noncentral-t power equation of the module docstring
    (``statsmodels``' ``TTestPower``; e.g. ``delta = 1.682`` at ``n = 5``, ``0.996`` at ``n =
    10``): a true mean difference of ``mdd`` is found significant in ``power`` of repeated
    experiments with ``n`` pairs whose differences have standard deviation ``std``. ``None`` for
    ``n < 2`` or no ``std``; 0 for ``std = 0``. O(1) per ``n`` after the first call (cached).
    """
    if n < 2 or std is None:
        return None
    return _effect_size(int(n), float(alpha), float(power)) * float(std)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values of one family: with the ``k`` tested p-values sorted
    ``p_(1) <= ... <= p_(k)``, ``p~_(i) = min(1, max_{j <= i} (k - j + 1) p_(j))`` (Holm 1979;
    the values of ``multipletests(method="holm")``, see the module docstring for why it is not
    called). ``None`` entries (untested comparisons) stay ``None`` and are not counted in the
    family. O(k log k)."""
    tested = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    if tested:
        p = np.asarray([pvalues[i] for i in tested], dtype=float)
        order = np.argsort(p, kind="stable")
        steps = (len(p) - np.arange(len(p))) * p[order]  # (k - j + 1) p_(j), j = 1..k
        adjusted = np.empty_like(p)
        adjusted[order] = np.minimum(1.0, np.maximum.accumulate(steps))
        for i, value in zip(tested, adjusted):
            out[i] = float(value)
    return out


def describe_runs(
    runs: Mapping[str, Mapping[str, Mapping[str, float]]],
    metrics: Sequence[str],
    reference: str | None = None,
    equivalence: Mapping[str, float] | None = None,
) -> dict:
    """Statistics of ``runs[method][run_id][metric]`` (successful runs only).

    Returns ``{"reference": name, "confidence", "alpha", "power", "stats": {method: {metric:
    t_interval + values + run_ids}}, "differences": {method: {metric: paired_difference +
    p_ttest_holm + p_wilcoxon_holm + run_ids}}}``. Differences are against ``reference``
    (default: the first method), on the run ids both methods have; the reference itself and
    methods without shared runs get no entry. Per metric, the methods' p-values form one Holm
    family (``holm``). ``equivalence``: ``{metric: margin}`` (margin in the values' unit):
    those metrics' differences also get ``tost`` and ``p_tost_holm``.
    """
    methods = list(runs)
    if reference is None and methods:
        reference = methods[0]
    if reference is not None and reference not in runs:
        raise ValueError(f"reference {reference!r} is not one of the methods {methods}")
    out: dict = {"reference": reference, "confidence": CONFIDENCE, "alpha": ALPHA, "power": POWER}
    out.update(stats={}, differences={})
    equivalence = dict(equivalence or {})
    unknown = sorted(set(equivalence) - set(metrics))
    if unknown:
        raise ValueError(f"equivalence margin for {unknown}: not among the metrics {list(metrics)}")
    for method, by_run in runs.items():
        row = {}
        for metric in metrics:
            ids = [r for r, m in by_run.items() if _has(m, metric)]
            if not ids:
                continue
            vals = [float(by_run[r][metric]) for r in ids]
            row[metric] = {**t_interval(vals), "values": vals, "run_ids": ids}
        out["stats"][method] = row
    if reference is None:
        return out
    ref_runs = runs[reference]
    for method, by_run in runs.items():
        if method == reference:
            continue
        row = {}
        for metric in metrics:
            ids = [r for r in by_run if _has(by_run[r], metric) and _has(ref_runs.get(r), metric)]
            if not ids:
                continue
            a = [float(by_run[r][metric]) for r in ids]
            b = [float(ref_runs[r][metric]) for r in ids]
            row[metric] = paired_difference(a, b)
            if metric in equivalence:
                row[metric].update(tost(a, b, equivalence[metric]))
            row[metric]["run_ids"] = ids
        out["differences"][method] = row
    for metric in metrics:
        family = [r[metric] for r in out["differences"].values() if metric in r]
        for key in ("p_ttest", "p_wilcoxon") + (("p_tost",) if metric in equivalence else ()):
            for d, p in zip(family, holm([d[key] for d in family])):
                d[f"{key}_holm"] = p
    return out


def _has(m: Mapping | None, metric: str) -> bool:
    return m is not None and m.get(metric) is not None and math.isfinite(float(m[metric]))


def _format_interval(st: dict | None, scale: float, digits: int, sign: str, star: str) -> str:
    if not st:
        return "-"
    mean = f"{scale * st['mean']:{sign}.{digits}f}"
    if st["ci_half_width"] is None:
        return f"{mean} (n={st['n']}, no CI)"
    return f"{mean} ± {scale * st['ci_half_width']:.{digits}f}{star}"


def format_mean_ci(st: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    """``"61.46 ± 1.23"``; ``"61.46 (n=1, no CI)"`` for one run; ``"-"`` when missing."""
    return _format_interval(st, scale, digits, "", "")


def format_difference(d: dict | None, scale: float = 100.0, digits: int = 2) -> str:
    """``"+1.20 ± 0.80 *"`` (``*``: the 95% CI excludes 0); ``"+1.20 (n=1, no CI)"``."""
    star = " *" if d and d["ci_excludes_zero"] else ""
    return _format_interval(d, scale, digits, "+", star)


def format_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def random_effects_mean(
    means: Sequence[float], variances: Sequence[float], confidence: float = CONFIDENCE
) -> dict:
    """Random-effects mean of ``k`` independent estimates (e.g. one paired mean difference per
    class split) with the DerSimonian-Laird between-estimate variance and the modified
    Hartung-Knapp-Sidik-Jonkman interval and t-test.

    With ``y_i`` the estimates and ``v_i > 0`` their variances (``s_i^2 / n_i`` of a paired
    mean): fixed-effect weights ``w_i = 1 / v_i``, Cochran's ``Q = sum w_i (y_i - y_FE)^2``;
    DerSimonian-Laird ``tau^2 = max(0, (Q - (k - 1)) / (sum w_i - sum w_i^2 / sum w_i))``
    (``statsmodels.stats.meta_analysis.combine_effects(method_re="dl")`` gives ``Q`` and the
    untruncated ``tau^2``; statsmodels 0.15 does not truncate it at 0, so it is truncated here);
    random-effects weights ``w*_i = 1 / (v_i + tau^2)`` and mean ``mu = sum w*_i y_i / sum w*_i``
    (``statsmodels`` ``WLS``); the HKSJ scale ``q = sum w*_i (y_i - mu)^2 / (k - 1)`` (the WLS
    residual scale), used as ``max(1, q)`` (Knapp & Hartung 2003, Roever et al. 2015: the plain
    HKSJ interval is narrower than the DerSimonian-Laird one when the estimates agree more than
    their variances predict, which with few estimates happens by chance); ``se = sqrt(max(1, q)
    / sum w*_i)``; interval ``mu +- t_{(1+confidence)/2, k-1} se``; two-sided p of ``t = mu /
    se`` on ``k - 1`` degrees of freedom. With ``k`` as small as 2-4 ``tau^2`` is poorly
    estimated; the t reference distribution with ``k - 1`` degrees of freedom is what keeps the
    test's level near nominal then (at the price of wide intervals).

    Returns ``{"k", "mean", "se", "ci_low", "ci_high", "ci_half_width", "t", "df", "p", "tau2",
    "q_cochran", "i2", "hksj_scale", "mean_fixed", "se_fixed"}``; for ``k = 1`` every entry but
    ``k``, ``mean`` (the one estimate), ``mean_fixed`` and ``se_fixed`` is ``None``. O(k).
    """
    y = np.asarray(means, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if y.ndim != 1 or y.size == 0 or v.shape != y.shape:
        raise ValueError(
            f"random_effects_mean: need two non-empty 1-D sequences of one length, got "
            f"{y.shape} and {v.shape}"
        )
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError(
            f"random_effects_mean: estimates must be finite and variances finite and positive, "
            f"got {y.tolist()} and {v.tolist()}"
        )
    k = int(y.size)
    w = 1.0 / v
    out = dict.fromkeys(
        ("se", "ci_low", "ci_high", "ci_half_width", "t", "df", "p", "tau2", "q_cochran", "i2")
    )
    out.update(
        k=k,
        mean=float(np.sum(w * y) / np.sum(w)),
        hksj_scale=None,
        mean_fixed=float(np.sum(w * y) / np.sum(w)),
        se_fixed=float(math.sqrt(1.0 / np.sum(w))),
    )
    if k < 2:
        return out
    # statsmodels goes on with its untruncated tau^2 (sqrt, 1 / (v + tau^2)): only Q, tau^2 used
    with np.errstate(invalid="ignore", divide="ignore"):
        combined = combine_effects(y, v, method_re="dl")
    tau2 = max(0.0, float(combined.tau2))
    w_re = 1.0 / (v + tau2)
    fit = WLS(y, np.ones(k), weights=w_re).fit()
    mean, scale = float(fit.params[0]), float(fit.scale)
    se = math.sqrt(max(1.0, scale) / float(np.sum(w_re)))
    df = k - 1
    half = float(stats.t.ppf(0.5 + confidence / 2, df) * se)
    t = mean / se
    q = float(combined.q)
    out.update(
        mean=mean,
        se=se,
        ci_low=mean - half,
        ci_high=mean + half,
        ci_half_width=half,
        t=t,
        df=df,
        p=float(2 * stats.t.sf(abs(t), df)),
        tau2=tau2,
        q_cochran=q,
        i2=max(0.0, 1 - df / q) if q > 0 else 0.0,
        hksj_scale=scale,
    )
    return out
