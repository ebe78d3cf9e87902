"""Retrieval pictures: AP by hand, query choice independent of the model, same queries for every
method of a comparison, figures written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pml_rank_plugins.functional import ranked_average_precision
from pml_rank_plugins.reporting import compare, retrieval
from tests.tiny import tiny_config


def test_average_precision_by_hand():
    rel = np.array(
        [
            [1, 0, 1, 0],  # (1/1 + 2/3) / 2
            [0, 0, 0, 1],  # (1/4) / 1
            [1, 1, 0, 0],  # (1 + 1) / 2
            [0, 0, 0, 0],  # no positive: NaN, never 0
        ],
        dtype=bool,
    )
    ap = ranked_average_precision(torch.as_tensor(rel)).numpy()
    assert ap[:3] == pytest.approx([(1 + 2 / 3) / 2, 0.25, 1.0])
    assert np.isnan(ap[3])


def test_query_choice_depends_only_on_eligibility_and_seed():
    labels = np.repeat(np.arange(10), 3)
    eligible = np.ones(30, dtype=bool)
    eligible[[0, 5]] = False
    a = retrieval.choose_queries(labels, eligible, 8, seed=0)
    assert np.array_equal(a, retrieval.choose_queries(labels, eligible, 8, seed=0))
    assert len(a) == 8 and np.all(np.diff(a) > 0) and not set(a) & {0, 5}
    assert not np.array_equal(a, retrieval.choose_queries(labels, eligible, 8, seed=1))
    assert len(retrieval.choose_queries(labels, eligible, 100, seed=0)) == 28
    with pytest.raises(ValueError, match="no query has a same-class reference"):
        retrieval.choose_queries(labels, np.zeros(30, dtype=bool), 8, seed=0)


def test_every_method_shows_the_same_queries(tmp_path):
    cfg = tiny_config()
    cfg["methods"] = {
        "Contrastive": None,
        "MultiSimilarity": {"loss_funcs": {"metric_loss": {"MultiSimilarityLoss": {}}}},
    }
    out = tmp_path / "cmp"
    summary = compare.run_comparison(
        cfg, out, overrides=["trainer.iterations_per_epoch=2", "trainer.num_epochs=1"]
    )
    records = {}
    for method in ("Contrastive", "MultiSimilarity"):
        for png in ("retrieval.png", "worst_queries.png"):
            assert (out / method / png).stat().st_size > 5000
        records[method] = json.loads((out / method / "retrieval.json").read_text())
        assert summary["pictures"][method][0].endswith("retrieval.png")
    a, b = records["Contrastive"], records["MultiSimilarity"]
    assert [q["query"] for q in a["queries"]] == [q["query"] for q in b["queries"]]
    assert len(a["queries"]) == 8 and a["split"] == "test"
    # Retrieved lists and AP come from each method's own embeddings.
    for rec in (a, b):
        for q in rec["queries"] + rec["worst"]:
            assert len(q["retrieved"]) == 5 and q["query"] not in q["retrieved"]
            assert 0.0 < q["ap"] <= 1.0
        worst = [q["ap"] for q in rec["worst"]]
        assert worst == sorted(worst) and worst[0] <= min(q["ap"] for q in rec["queries"])
