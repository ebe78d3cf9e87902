"""A config without a test split reports its best validation epoch's validation metrics: the
tables and plots must say so instead of calling them test metrics."""

from __future__ import annotations

from pml_rank_plugins.experiment.yamlfile import dump_yaml
from pml_rank_plugins.reporting import compare
from pml_rank_plugins.reporting.summary import summarize
from pml_rank_plugins.reporting.tables import (
    evaluated_on,
    markdown_table,
    reported_split,
    split_title,
)
from tests.tiny import tiny_config

VAL = {"val": {"mean_average_precision_at_r": 0.61, "precision_at_1": 0.9}}
HISTORY = [
    {
        "epoch": 1,
        "validation": {"val": {"mean_average_precision_at_r": 0.5, "precision_at_1": 0.8}},
    },
    {"epoch": 2, "validation": VAL},
]


def _run(test: dict) -> dict:
    return {
        "name": "m",
        "status": "finished",
        "best": {"epoch": 2, "value": 0.61},
        "history": HISTORY,
        "test": test,
    }


def test_the_best_epochs_validation_entry_is_recognized_as_validation():
    assert reported_split(_run(dict(VAL))) == "validation"
    # a held-out split, even one with equal values under another name, is a test
    assert reported_split(_run({"test": VAL["val"]})) == "test"
    assert reported_split(_run({"val": {"mean_average_precision_at_r": 0.6}})) == "test"
    assert reported_split({"status": "finished", "test": {}}) == "test"  # nothing to compare
    assert evaluated_on([_run(dict(VAL)), _run({"test": VAL["val"]})]) == "test and validation"
    assert evaluated_on([]) == "test"
    assert split_title({}) == "Test" and split_title({"evaluated_on": "validation"}) == "Validation"


def test_a_table_of_validation_metrics_says_so():
    results = {"m": {"seed0": _run(dict(VAL)), "seed1": _run(dict(VAL))}}
    summary = summarize(results)
    assert summary["evaluated_on"] == "validation"
    text = markdown_table(summary)
    assert "Validation metrics in %" in text and "**No test split**" in text
    assert "Test metrics" not in text
    results = {"m": {"seed0": _run({"test": VAL["val"]})}}
    text = markdown_table(summarize(results))
    assert "Test metrics in %" in text and "No test split" not in text


def test_a_comparison_without_eval_test_reports_validation(tmp_path, png_plots_only):
    methods = {
        "A": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}},
        "B": {"loss_funcs": {"metric_loss": {"TripletMarginLoss": {}}}},
    }
    cfg = tiny_config(eval={"test": []})
    cfg["methods"] = methods
    dump_yaml(cfg, tmp_path / "no_test.yaml")
    summary = compare.run_comparison(
        tmp_path / "no_test.yaml", tmp_path / "out", seeds=1, pictures=False
    )
    assert summary["evaluated_on"] == "validation"
    assert "Validation metrics in %" in (tmp_path / "out" / "comparison.md").read_text()
    cfg = tiny_config()
    cfg["methods"] = methods
    dump_yaml(cfg, tmp_path / "with_test.yaml")
    with_test = compare.run_comparison(
        tmp_path / "with_test.yaml", tmp_path / "out2", seeds=1, pictures=False
    )
    assert with_test["evaluated_on"] == "test"
