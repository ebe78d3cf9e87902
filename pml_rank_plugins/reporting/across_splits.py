"""Robustness across splits (issue 42): a comparison's verdicts on several class-disjoint splits
and pooled over them.

From the ``summary.json`` of one comparison per split (``compare`` on the same methods, each on
another ``split`` seed), per row its paired difference against the reference and verdict on each
split, recomputed from the rows' values by the rules of the comparison tables
(:func:`_split_differences`), and the random-effects mean over the splits
(``reporting.statistics.random_effects_mean``) with Holm over the rows; "holds across splits"
when the direction is the same on every split and the pooled Holm p is below 0.05
(:func:`across_splits`). :func:`across_splits_table` and :func:`across_splits_sentences` write
it; :func:`level_simulation` measures the pooled test's level for a design.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats

from . import statistics
from .tables import metric_label, verdict

SPLIT_KEY = "split.class_disjoint_split.seed"  # what `compare --allow-budget-change` records


def split_seed(summary: dict, where: str, expected: int, key: str = SPLIT_KEY) -> int:
    """The class split of a comparison: the split seed (``key``, by default
    ``split.class_disjoint_split.seed``) that its
    ``summary.json`` records in ``budget_changes`` (``compare --tuned ... --allow-budget-change
    --set``), else ``expected`` (a comparison run at its config's split, or a claim, whose
    ``--set`` is not recorded). A recorded seed other than ``expected`` raises ValueError naming
    ``where`` (the file): a folder named for one split must not hold another's runs."""
    used = {
        c["used"]
        for changes in (summary.get("budget_changes") or {}).values()
        for c in changes
        if c.get("key") == key
    }
    if len(used) > 1 or (used and used != {expected}):
        raise ValueError(f"{where}: records {key} = {sorted(used)}, expected {expected}")
    return expected


def _split_differences(
    summary: dict, reference: str, run_ids: set[str] | None = None
) -> dict[str, dict]:
    """``{name: paired difference of the primary metric against reference, with verdict}`` of
    one comparison, recomputed from its ``rows`` (values and run ids) with the study's rules
    (:func:`statistics.describe_runs`: Holm over the table's rows, TOST against the summary's
    margin; :func:`tables.verdict`); ``run_ids``: only those runs (every run when None)."""
    primary, margin = summary["primary_metric"], summary.get("equivalence_margin")
    if reference not in summary["rows"]:
        raise ValueError(f"reference {reference!r} is not a row of the summary")
    runs = {
        name: {
            rid: {primary: v}
            for rid, v in zip(row[primary]["run_ids"], row[primary]["values"])
            if run_ids is None or rid in run_ids
        }
        for name, row in summary["rows"].items()
        if primary in row
    }
    equivalence = {primary: margin / 100} if margin is not None else None
    described = statistics.describe_runs(runs, [primary], reference, equivalence)
    out = {}
    for name, row in described["differences"].items():
        if primary in row:
            out[name] = row[primary]
            out[name]["verdict"] = verdict(row[primary], margin)
    return out


def _direction(mean: float) -> str:
    return "higher" if mean > 0 else "lower" if mean < 0 else "zero"


def _pool(per_split: dict[int, dict | None]) -> dict | None:
    """:func:`statistics.random_effects_mean` of one row's per-split paired means (variance
    ``s^2 / n``); ``None`` when a split lacks the row or its spread (n < 2, zero variance)."""
    cells = list(per_split.values())
    if any(d is None or d["std"] is None or d["std"] <= 0 for d in cells):
        return None
    return statistics.random_effects_mean(
        [d["mean"] for d in cells], [d["std"] ** 2 / d["n"] for d in cells]
    )


def across_splits(summaries: dict[int, dict], reference: str) -> dict:
    """Every row's difference against ``reference`` on each split and pooled over the splits.

    ``summaries``: ``{split seed: summary.json}``, the study's split first (its row order is the
    table's). Per split: the paired difference on all its runs and its verdict, by the rules of
    the study's tables (:func:`_split_differences`). Pooled: the random-effects mean of the
    per-split mean differences (:func:`statistics.random_effects_mean`; DerSimonian-Laird,
    modified Hartung-Knapp, ``k - 1`` degrees of freedom), its p-values Holm-adjusted over the
    table's rows. The study's split enters the pooled test with the seeds the other splits ran
    (the union of their run ids: seeds 1-5), so each split weighs by one design and the split
    that chose the tuned settings and the reference does not count twice; ``pooled_all_seeds``
    repeats the analysis with all its seeds (a sensitivity check). ``holds``: the same direction
    on every split and the pooled Holm p below alpha.
    """
    seeds = list(summaries)
    if not seeds:
        raise ValueError("across_splits: no summaries")
    study, others = seeds[0], seeds[1:]
    primary = summaries[study]["primary_metric"]
    other_ids = {r for s in others for r in summaries[s]["rows"][reference][primary]["run_ids"]}
    per_split = {s: _split_differences(summaries[s], reference) for s in seeds}
    pooled_in = dict(per_split)
    if others:
        pooled_in[study] = _split_differences(summaries[study], reference, other_ids)
    names = [n for n in summaries[study]["rows"] if n != reference]
    rows: dict[str, dict] = {}
    for name in names:
        cells = {s: per_split[s].get(name) for s in seeds}
        rows[name] = {
            "splits": {str(s): cells[s] for s in seeds},
            "pooled": _pool({s: pooled_in[s].get(name) for s in seeds}) if others else None,
            "pooled_all_seeds": _pool(cells) if others else None,
            # the study split's difference on the pooled seeds (what enters "pooled")
            "study_split_pooled_seeds": pooled_in[study].get(name) if others else None,
        }
    for key in ("pooled", "pooled_all_seeds"):
        family = [r[key] for r in rows.values() if r[key] is not None]
        for p, adjusted in zip(family, statistics.holm([p["p"] for p in family])):
            p["p_holm"] = adjusted
    alpha = statistics.ALPHA
    for row in rows.values():
        means = [c["mean"] for c in row["splits"].values() if c is not None]
        same = len(means) == len(seeds) and len({_direction(m) for m in means}) == 1
        for key in ("pooled", "pooled_all_seeds"):
            p = row[key]
            row[f"holds{'' if key == 'pooled' else '_all_seeds'}"] = bool(
                p is not None and same and p.get("p_holm") is not None and p["p_holm"] < alpha
            )
        row["same_direction"] = same
    return {
        "reference": reference,
        "primary_metric": primary,
        "alpha": alpha,
        "splits": {
            str(s): {
                "n_seeds": len(summaries[s]["rows"][reference][primary]["run_ids"]),
                "run_ids": summaries[s]["rows"][reference][primary]["run_ids"],
            }
            for s in seeds
        },
        "pooled_run_ids": {
            str(s): (
                sorted(other_ids, key=lambda r: (len(r), r))
                if s == study and others
                else summaries[s]["rows"][reference][primary]["run_ids"]
            )
            for s in seeds
        },
        "pooled_method": (
            "random-effects mean of the per-split paired mean differences: DerSimonian-Laird"
            " tau^2, modified Hartung-Knapp-Sidik-Jonkman interval and t-test on k - 1 degrees"
            " of freedom; Holm over the table's rows"
        ),
        "rows": rows,
    }


def _split_cell(d: dict | None) -> str:
    if d is None:
        return "not run"  # the split's comparison lacks the row (e.g. a --methods subset)
    return f"{statistics.format_difference(d)}: {d['verdict']}"


def _pooled_cell(p: dict | None) -> str:
    if p is None or p["se"] is None:
        return "-"
    tau = 100 * math.sqrt(p["tau2"])
    return f"{100 * p['mean']:+.2f} ± {100 * p['ci_half_width']:.2f} (τ {tau:.2f})"


def _holds_cell(row: dict, splits: list[str], alpha: float) -> str:
    p = row["pooled"]
    if len(splits) < 2:
        return "not tested (one split)"
    if p is None or p["se"] is None:
        return "not tested (a split lacks the row, or the spread of its differences)"
    if row["holds"]:
        return f"**yes ({_direction(p['mean'])})**"
    if not row["same_direction"]:
        signs = ", ".join(
            f"{s} {'+' if row['splits'][s]['mean'] > 0 else '-'}"
            for s in splits
            if row["splits"][s] is not None
        )
        return f"no: direction differs ({signs})"
    return f"no: pooled Holm p ≥ {alpha:g}"


def across_splits_table(report: dict, label: str) -> str:
    """The Markdown table of :func:`across_splits` (``label``: the first column's head)."""
    splits = list(report["splits"])
    label_metric = metric_label(report["primary_metric"])
    head = [f"{label} − {report['reference']} (Δ{label_metric}, points)"]
    for i, s in enumerate(splits):
        n = report["splits"][s]["n_seeds"]
        head.append(f"split {s}{' (study)' if i == 0 else ''}, n = {n}")
    head += ["pooled (95% CI; τ)", "p pooled (Holm)", "holds across splits"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- |" + " ---: |" * len(splits) + " ---: | ---: | --- |",
    ]
    for name, row in report["rows"].items():
        p = row["pooled"]
        pcell = (
            "-"
            if p is None or p["p"] is None
            else (f"{statistics.format_p(p['p'])} ({statistics.format_p(p['p_holm'])})")
        )
        cells = [name] + [_split_cell(row["splits"][s]) for s in splits]
        sub = row["study_split_pooled_seeds"]
        if sub is not None:
            cells[1] += f" (seeds {seed_range(report['pooled_run_ids'][splits[0]])}:"
            cells[1] += f" {100 * sub['mean']:+.2f})"
        cells += [_pooled_cell(p), pcell, _holds_cell(row, splits, report["alpha"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_range(run_ids: list[str]) -> str:
    """``"1-5"`` for seed1..seed5; the ids joined otherwise."""
    nums = [int(r[4:]) for r in run_ids if r.startswith("seed") and r[4:].isdigit()]
    if len(nums) == len(run_ids) and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"{nums[0]}-{nums[-1]}"
    return ", ".join(run_ids)


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _split_specific(name: str, row: dict, splits: list[str]) -> str:
    """``"m=0 (lower on split 0; also lower on split 1)"``: the study split's verdict, the
    other splits where the same direction was decided too and, when the mean difference has the
    same sign on every split without each deciding it, ``"; the same sign on every split"`` (a
    reader should see a consistent direction that the pooled test does not confirm)."""
    study = splits[0]
    verdict = row["splits"][study]["verdict"]
    direction = verdict.split()[0]
    also = [
        k
        for k in splits[1:]
        if row["splits"].get(k) is not None and row["splits"][k]["verdict"].startswith(direction)
    ]
    more = (
        f"; also {direction} on split{'s' if len(also) > 1 else ''} {_names(also)}" if also else ""
    )
    if row["same_direction"] and len(also) < len(splits) - 1:
        more += "; the same sign on every split"
    return f"{name} ({verdict} on split {study}{more})"


def across_splits_sentences(report: dict, what: str) -> str:
    """What holds across splits and what is split-specific, as sentences generated from
    :func:`across_splits` (``what``: how to name the rows, e.g. ``"method"``)."""
    splits = list(report["splits"])
    ref, study = report["reference"], splits[0]
    if len(splits) < 2:
        return (
            f"Only split {study} has finished: nothing can be said across splits yet, and every"
            " verdict is split-specific.\n"
        )
    held = {
        d: [
            n
            for n, r in report["rows"].items()
            if r["holds"] and _direction(r["pooled"]["mean"]) == d
        ]
        for d in ("higher", "lower")
    }
    out = []
    for d in ("lower", "higher"):
        if held[d]:
            out.append(
                f"**Holds across splits {_names(splits)}:** {_names(held[d])} "
                f"{'score' if len(held[d]) > 1 else 'scores'} {d} than {ref} (the same"
                " direction on every split and the pooled test significant after Holm)."
            )
    if not held["lower"] and not held["higher"]:
        out.append(
            f"**No {what}'s difference against {ref} holds across splits {_names(splits)}** (the"
            " same direction on every split and the pooled test significant after Holm)."
        )
    specific = [
        _split_specific(n, r, splits)
        for n, r in report["rows"].items()
        if not r["holds"]
        and r["splits"][study] is not None
        and r["splits"][study]["verdict"].startswith(("higher", "lower"))
    ]
    if specific:
        out.append(
            f"**Split-specific:** {_names(specific)}: decided on split {study}, not shown to hold"
            " across the splits."
        )
    changed = [n for n, r in report["rows"].items() if r["holds"] != r["holds_all_seeds"]]
    out.append(
        f"With all {report['splits'][study]['n_seeds']} seeds of split {study} in the pooled"
        " test instead of the other splits' seeds, "
        + (
            f"the column would differ for {_names(changed)}."
            if changed
            else 'the column "holds across splits" is the same.'
        )
    )
    return "\n\n".join(out) + "\n"


def level_simulation(
    splits: Sequence[int], tau: float, sd: float, n: int = 5, draws: int = 20000, seed: int = 0
) -> dict[int, dict[str, float]]:
    """How often each pooled test rejects a zero mean difference at ``alpha`` (its level), by
    simulation of this design: per draw, ``k`` splits with true differences ``N(0, tau^2)`` and
    ``n`` paired seeds each with differences ``N(true, sd^2)``. ``random_effects``: the test of
    :func:`statistics.random_effects_mean` (vectorized over draws here; tested equal to it);
    ``blocked``: the paired analysis with split as a block (``diff ~ split``, the mean of the
    split means tested with the pooled within-split variance on ``k (n - 1)`` degrees of
    freedom). Returns ``{k: {"random_effects", "blocked"}}`` rejection rates. O(draws k n)."""
    rng = np.random.default_rng(seed)
    alpha = statistics.ALPHA
    out = {}
    for k in splits:
        d = rng.normal(0.0, tau, (draws, k, 1)) + rng.normal(0.0, sd, (draws, k, n))
        y, s2 = d.mean(axis=2), d.var(axis=2, ddof=1)
        p_re = random_effects_p(y, s2 / n)
        se_b = np.sqrt(s2.mean(axis=1) / (n * k))
        p_b = 2 * stats.t.sf(np.abs(y.mean(axis=1) / se_b), k * (n - 1))
        out[k] = {
            "random_effects": float(np.mean(p_re < alpha)),
            "blocked": float(np.mean(p_b < alpha)),
        }
    return out


def random_effects_p(y: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The p-value of :func:`statistics.random_effects_mean` for each row of ``y`` / ``v``
    (``(draws, k)``, ``k >= 2``), in numpy for the simulation."""
    k = y.shape[1]
    w = 1 / v
    y_fe = (w * y).sum(1, keepdims=True) / w.sum(1, keepdims=True)
    q = (w * (y - y_fe) ** 2).sum(1)
    c = w.sum(1) - (w**2).sum(1) / w.sum(1)
    tau2 = np.maximum(0.0, (q - (k - 1)) / c)
    ws = 1 / (v + tau2[:, None])
    mu = (ws * y).sum(1) / ws.sum(1)
    scale = (ws * (y - mu[:, None]) ** 2).sum(1) / (k - 1)
    se = np.sqrt(np.maximum(1.0, scale) / ws.sum(1))
    return 2 * stats.t.sf(np.abs(mu / se), k - 1)
