"""Retrieval pictures: AP by hand, query choice independent of the model, same queries for every
method of a comparison, figures written."""

from __future__ import annotations

import json

import matplotlib.colors
import matplotlib.text
import numpy as np
import pytest
import torch

from pml_rank_plugins.functional import ranked_average_precision
from pml_rank_plugins.reporting import compare, retrieval, style
from tests.tiny import TinyDataset, tiny_config


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
        names = ["retrieval.png", "retrieval.pdf", "worst_queries.png", "worst_queries.pdf"]
        assert [p.rsplit("/", 1)[-1] for p in summary["pictures"][method]] == names + [
            "retrieval.json"
        ]
        assert (out / method / "retrieval.pdf").read_bytes()[:4] == b"%PDF"
    a, b = records["Contrastive"], records["MultiSimilarity"]
    assert [q["query"] for q in a["queries"]] == [q["query"] for q in b["queries"]]
    assert len(a["queries"]) == 8 and a["split"] == "test"
    # Retrieved lists and AP come from each method's own embeddings.
    for rec in (a, b):
        for q in rec["queries"] + rec["worst"]:
            assert len(q["retrieved"]) == 5 and q["query"] not in q["retrieved"]
            assert len(q["retrieved_labels"]) == 5
            assert [lab == q["label"] for lab in q["retrieved_labels"]] == q["correct"]
            assert 0.0 < q["ap"] <= 1.0
        worst = [q["ap"] for q in rec["worst"]]
        assert worst == sorted(worst) and worst[0] <= min(q["ap"] for q in rec["queries"])


def test_grid_tiles_carry_rank_mark_class_label_and_a_frame_style_per_kind():
    data = TinyDataset(num_classes=3, per_class=4)
    rows = [
        {
            "query": 0,
            "label": 0,
            "ap": 0.5,
            "retrieved": [1, 5, 2],
            "retrieved_labels": [0, 1, 0],
            "correct": [True, False, True],
        },
        {
            "query": 4,
            "label": 1,
            "ap": 1.0,
            "retrieved": [5],
            "retrieved_labels": [1],
            "correct": [True],
        },
    ]
    fig = retrieval.grid_figure(rows, data, [data], "title\nsecond line")
    axes = np.array(fig.axes).reshape(2, 4)
    assert fig._suptitle.get_text() == "title\nsecond line"
    assert [ax.get_xlabel() for ax in axes[0]] == ["class 0", "class 0", "class 1", "class 0"]
    assert axes[0, 0].get_title() == "query\nAP 0.50"
    assert [ax.get_title() for ax in axes[0, 1:]] == ["#1 \u2713", "#2 \u2717", "#3 \u2713"]
    assert not axes[1, 2].get_visible() or not axes[1, 2].axison  # no tile past k for row 2
    styles = [ax.spines["top"].get_linestyle() for ax in axes[0, 1:3]]
    assert styles[0] != styles[1]  # correct solid, wrong dashed: not colour alone
    colors = [ax.spines["top"].get_edgecolor() for ax in axes[0, 1:3]]
    assert matplotlib.colors.same_color(colors[0], retrieval.FRAME["correct"][0])
    assert matplotlib.colors.same_color(colors[1], retrieval.FRAME["wrong"][0])
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()][1:] == [
        "\u2713 same class",
        "\u2717 other class",
    ]
    fig.draw_without_rendering()
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip()
    ]
    assert min(sizes) >= style.MIN_FONT_PT
