"""reporting.convergence: the convergence probe's budget and the late-gain check from hand-made
curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pml_rank_plugins.reporting import convergence


def test_best_so_far_carries_the_best_after_an_early_stop():
    got = convergence.best_so_far([0.1, 0.3, 0.2], 5)
    assert got.tolist() == [0.1, 0.3, 0.3, 0.3, 0.3]


def test_budget_is_where_the_best_methods_mean_comes_within_half_a_point():
    curves = {
        # mean best-so-far: 0.50, 0.60, 0.6075, 0.61, 0.61 -> plateau 0.61, within 0.005 at 3
        "a": {"seed0": [0.5, 0.6, 0.605, 0.61, 0.60], "seed1": [0.5, 0.6, 0.61]},
        "b": {"seed0": [0.2, 0.4, 0.5, 0.55, 0.56]},  # plateau 0.56 < 0.61: not the best curve
    }
    report = convergence.convergence(curves)
    a = report["methods"]["a"]
    assert a["mean_best_so_far"] == pytest.approx([0.5, 0.6, 0.6075, 0.61, 0.61])
    assert a["plateau"] == pytest.approx(0.61) and a["converged_epoch"] == 3
    assert report["methods"]["b"]["converged_epoch"] == 5  # 0.55 < 0.56 - 0.005
    assert report["best_method"] == "a" and report["budget_epochs"] == 3


def write_curve(run: Path, vals: list[float]) -> None:
    """A finished run of method ``m`` whose validation MAP@R per epoch is ``vals``."""
    run.mkdir(parents=True)
    history = [
        {"epoch": i + 1, "validation": {"val": {"mean_average_precision_at_r": v}}}
        for i, v in enumerate(vals)
    ]
    (run / "metrics.json").write_text(
        json.dumps({"name": "m", "status": "finished", "history": history})
    )


def test_convergence_check_measures_the_late_gain_and_late_bests(tmp_path):
    late = convergence.LATE
    curves = {
        "seed1": [0.5] * 10 + [0.6] * (late - 1) + [0.62],  # still rising: best at the end
        "seed2": [0.5] * 5 + [0.7] * (late + 5),  # flat since epoch 6
    }
    for seed, vals in curves.items():
        write_curve(tmp_path / "tuned" / "m" / seed, vals)
    report = convergence.convergence_check(tmp_path / "tuned")
    m = report["methods"]["m"]
    # mean best-so-far: end (0.62 + 0.7) / 2, LATE epochs before (0.5 + 0.7) / 2
    assert m["late_gain"] == pytest.approx(0.06) and m["best_in_late"] == 1
    md = convergence.convergence_check_markdown(report)
    assert f"| m | 2 | 66.00 | {10 + late} | 6.00 | 1 |" in md
