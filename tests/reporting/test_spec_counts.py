"""A comparison parses its configs once (issue 30 item 1): a 2-method ``compare`` validates 2
times, reads YAML once and builds models no more often than it trains and draws.

``scripts/count_calls.py`` prints the whole table; this pins the targets.
"""

from __future__ import annotations

import collections

from pml_rank_plugins.experiment import builder, methods, schema, spec
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.reporting import compare
from tests.tiny import tiny_config


def test_two_method_compare_validates_twice_and_reads_yaml_once(
    tmp_path, monkeypatch, png_plots_only
):
    counts: collections.Counter = collections.Counter()

    def counting(label, fn):
        def counted(*args, **kwargs):
            counts[label] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(spec, "validate", counting("validate", spec.validate))
    monkeypatch.setattr(schema, "load_yaml", counting("yaml", schema.load_yaml))
    monkeypatch.setattr(spec, "load_yaml", counting("yaml", spec.load_yaml))
    monkeypatch.setattr(builder, "build_models", counting("models", builder.build_models))
    # small pictures: drawn (what is counted), without spending seconds on tiles and PDFs
    cfg = tiny_config(
        trainer={"MetricLossOnly": {"num_epochs": 1}},
        eval={"pictures": {"num_queries": 2, "k": 2, "pdf": False}},
    )
    cfg["methods"] = {
        "A": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}},
        "B": {"loss_funcs": {"metric_loss": {"TripletMarginLoss": {}}}},
    }
    path = tmp_path / "two.yaml"
    dump_yaml(cfg, path)
    # what the CLI does: collect, check, hand the specs on
    specs = methods.collect_methods([path])
    methods.check_methods(specs)
    summary = compare.run_comparison(specs, tmp_path / "out", seeds=1, pictures=True)
    assert not summary.get("failed") and set(summary["pictures"]) == {"A", "B"}
    assert all(isinstance(p, list) for p in summary["pictures"].values())  # drawn, not failed
    assert 0 < summary["pictures_seconds"] < summary["total_wall_seconds"]  # timed, included
    assert counts["validate"] == 2
    assert counts["yaml"] == 1
    trained_and_drawn = 2 + 2
    assert counts["models"] <= trained_and_drawn, counts
