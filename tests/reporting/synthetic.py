"""Synthetic comparison results (``{name: {run_id: metrics.json contents}}``) for the table and
plot tests: no training, shaped like the runner's ``metrics.json``."""

from __future__ import annotations

import numpy as np

METHODS = ["plugin FastAP", "PML FastAP", "PML Contrastive", "PML Triplet + miner", "MyLoss"]


def synthetic_results(methods=METHODS, seeds: int = 3, epochs: int = 4) -> dict:
    """Each method x seed with a validation history (MAP@R per epoch), test P@1, MAP@R and
    Recall@{1,2,4}, and a wall time."""
    rng = np.random.default_rng(0)
    results: dict = {}
    for j, name in enumerate(methods):
        results[name] = {}
        for s in range(seeds):
            base = 0.5 + 0.03 * j + 0.01 * rng.standard_normal()
            history = [
                {
                    "epoch": e,
                    "validation": {"val": {"mean_average_precision_at_r": base * e / epochs}},
                }
                for e in range(1, epochs + 1)
            ]
            test = {"precision_at_1": 0.9, "mean_average_precision_at_r": base}
            test.update({f"recall_at_{k}": 0.85 + 0.03 * k for k in (1, 2, 4)})
            results[name][f"seed{s}"] = {
                "test": {"test": test},
                "history": history,
                "wall_seconds": 10.0 + j,
            }
    return results
