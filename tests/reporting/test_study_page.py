"""reporting.study_page: the report of ``pml-rank study`` from synthetic split summaries: its
across-splits table is the one ``across_splits`` makes of them, A (about 5 points below the
reference on every split) holds, the figure and the compute table are written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pml_rank_plugins.reporting import study_page
from pml_rank_plugins.reporting.across_splits import across_splits, across_splits_table
from pml_rank_plugins.running.study_plan import StudyPlan
from tests.reporting.split_summaries import split_summary, synthetic_splits


@pytest.mark.usefixtures("png_plots_only")
def test_the_report_leads_with_the_across_splits_verdict(tmp_path):
    values = synthetic_splits(np.random.default_rng(4))
    summaries = {s: split_summary(v, s) for s, v in values.items()}
    plan = StudyPlan(
        methods=tuple(values[0]),
        trials=1,
        seeds=5,
        split_key="split.class_disjoint_split.seed",
        split_seeds=(0, 1, 2, 3),
        reference="ref",
        budget_hash="sha256:x",
    )
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "tune.md").write_text("| method | best value (%) |\n")
    seconds = {"tune": 12.0, "split0": 70.0, "split1": 3700.0}
    report = study_page.write_study_outputs(tmp_path, plan, summaries, seconds)
    expected = across_splits(summaries, "ref")
    assert json.loads(json.dumps(report["across_splits"])) == json.loads(json.dumps(expected))
    assert report["failed_runs"] == 0 and report["plan"]["split_seeds"] == (0, 1, 2, 3)
    assert report["across_splits"]["rows"]["A"]["holds"] is True
    md = (tmp_path / "study.md").read_text()
    assert md.startswith("# Study: is any method better than ref?\n")
    assert "5 methods (first, ref, A, B, C), each tuned with 1 trial on split 0's" in md
    assert across_splits_table(expected, "method") in md
    assert md.index("## Across splits") < md.index("## Split 0 (the tuning's split)")
    assert md.index("## Split 3") < md.index("## Tuning") < md.index("## Compute")
    assert "| method | best value (%) |" in md  # tune.md, as tune wrote it
    # per step: the trainings and this call's wall time ("-": a step this call did not time)
    assert (
        "| tune | 5 trials | 12 s |" in md and "| split0 | 50 runs (0 failed) | 1 min 10 s |" in md
    )
    assert "| split1 | 25 runs (0 failed) | 1 h 01 min |" in md
    assert "| split3 | 25 runs (0 failed) | - |" in md
    assert json.loads((tmp_path / "study.json").read_text())["plan"]["trials"] == 1
    assert (tmp_path / "across_splits.png").stat().st_size > 0
    assert report["figures"] == [str(tmp_path / "across_splits.png")]
