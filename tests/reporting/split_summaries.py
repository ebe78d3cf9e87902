"""Synthetic ``summary.json`` files of one comparison per class split, for the across-splits tests
(tests/reporting/test_across_splits.py, test_results_page.py)."""

from __future__ import annotations

import json

import numpy as np
from scipy import stats

from pml_rank_plugins.reporting import across_splits
from pml_rank_plugins.reporting.summary import summarize

PRIMARY = "mean_average_precision_at_r"


def split_results(values: dict[str, list[float]], first_seed: int = 1) -> dict:
    """``{method: {run_id: metrics.json}}`` of finished runs with test MAP@R ``values``."""
    return {
        name: {
            f"seed{first_seed + i}": {
                "name": name,
                "status": "finished",
                "test": {"test": {PRIMARY: v}},
                "wall_seconds": 100.0,
            }
            for i, v in enumerate(vs)
        }
        for name, vs in values.items()
    }


def split_summary(values: dict[str, list[float]], split: int, first_seed: int = 1) -> dict:
    """A ``summary.json`` as ``compare --tuned ... --set split...seed=k --allow-budget-change``
    writes it (``reporting.summary.summarize`` plus the command's record) for test MAP@R
    ``values[method]`` on seeds ``first_seed, first_seed + 1, ...``."""
    results = split_results(values, first_seed)
    summary = summarize(results, reference=next(iter(values)), primary=PRIMARY, margin=1.0)
    n = max(len(v) for v in values.values())
    summary |= {"total_wall_seconds": 50.0 * n * len(values), "seeds": n, "jobs": 2}
    key = across_splits.SPLIT_KEY
    summary["budget_changes"] = (
        {m: [{"key": key, "tuned": 0, "used": split, "set": key}] for m in values} if split else {}
    )
    return json.loads(json.dumps(summary))  # as read back from the file


def synthetic_splits(rng: np.random.Generator) -> dict[int, dict[str, list[float]]]:
    """Four splits (0: 10 seeds, 1-3: 5): A trails the reference by about 5 points on every
    split, B leads by 3 on split 0 and trails by 3 on the others, C is noise."""
    out = {}
    for split, n in ((0, 10), (1, 5), (2, 5), (3, 5)):
        ref = 0.70 + 0.02 * rng.standard_normal(n)
        out[split] = {
            "first": 0.60 + 0.02 * rng.standard_normal(n),  # compare's reference, not the study's
            "ref": ref,
            "A": ref - 0.05 - 0.01 * split + 0.005 * rng.standard_normal(n),
            "B": ref + (0.03 if split == 0 else -0.03) + 0.005 * rng.standard_normal(n),
            "C": ref + 0.01 * rng.standard_normal(n),
        }
    return {s: {k: list(v) for k, v in vals.items()} for s, vals in out.items()}


def dl_hksj(y: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    """Random-effects mean, modified-HKSJ 95% half-width and p, written out (DerSimonian-Laird
    tau^2 truncated at 0; Hartung-Knapp scale max(1, q); t on k - 1 df)."""
    k, w = len(y), 1 / v
    q = (w * (y - (w * y).sum() / w.sum()) ** 2).sum()
    tau2 = max(0.0, (q - (k - 1)) / (w.sum() - (w**2).sum() / w.sum()))
    ws = 1 / (v + tau2)
    mu = (ws * y).sum() / ws.sum()
    se = np.sqrt(max(1.0, (ws * (y - mu) ** 2).sum() / (k - 1)) / ws.sum())
    return mu, stats.t.ppf(0.975, k - 1) * se, 2 * stats.t.sf(abs(mu / se), k - 1)
