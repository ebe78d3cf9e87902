"""Recall@K on top of PML's AccuracyCalculator; faiss and no-faiss paths; query/gallery split."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from pml_rank_plugins.data.splits import query_gallery_split
from pml_rank_plugins.experiment import accuracy
from pml_rank_plugins.experiment.accuracy import make_accuracy_calculator


def _data(seed=0, n=40, dim=6, classes=5):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1)
    labels = torch.arange(n) % classes
    labels[-1] = classes  # a lone query: its class has no other item
    return emb, labels


def _recall_loop(query, qlabels, ref, rlabels, k, same_set):
    """Recall@K straight from the definition, one query at a time."""
    hits, counted = 0, 0
    for i in range(len(query)):
        sims = [(float(query[i] @ ref[j]), j) for j in range(len(ref)) if not (same_set and j == i)]
        positives = [j for _, j in sims if rlabels[j] == qlabels[i]]
        if not positives:
            continue  # lone query: excluded, as PML does for its k-NN metrics
        counted += 1
        top = [j for _, j in sorted(sims, key=lambda t: -t[0])[:k]]
        hits += any(rlabels[j] == qlabels[i] for j in top)
    return hits / counted


@pytest.mark.parametrize("use_faiss", [True, False])
def test_recall_at_k_matches_definition(use_faiss):
    emb, labels = _data()
    calc = make_accuracy_calculator(recall_at_k=[1, 2, 4, 16], use_faiss=use_faiss)
    acc = calc.get_accuracy(emb, labels)
    for k in (1, 2, 4, 16):
        expected = _recall_loop(emb, labels, emb, labels, k, same_set=True)
        assert acc[f"recall_at_{k}"] == pytest.approx(expected, abs=1e-12)
    assert set(acc) == {
        "precision_at_1",
        "r_precision",
        "mean_average_precision_at_r",
        "recall_at_1",
        "recall_at_2",
        "recall_at_4",
        "recall_at_16",
    }
    assert acc["recall_at_1"] == pytest.approx(acc["precision_at_1"])
    assert acc["recall_at_1"] <= acc["recall_at_2"] <= acc["recall_at_4"] <= acc["recall_at_16"]


def test_recall_at_k_query_vs_gallery():
    emb, labels = _data(seed=1)
    q, g = emb[:15], emb[15:]
    ql, gl = labels[:15], labels[15:]
    acc = make_accuracy_calculator(recall_at_k=[1, 3]).get_accuracy(q, ql, g, gl)
    for k in (1, 3):
        assert acc[f"recall_at_{k}"] == pytest.approx(_recall_loop(q, ql, g, gl, k, False))


def test_no_faiss_falls_back_to_custom_knn(monkeypatch):
    emb, labels = _data(seed=2)
    with_faiss = make_accuracy_calculator(recall_at_k=[1, 8]).get_accuracy(emb, labels)
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now raises ImportError
    assert not accuracy.faiss_available()
    calc = make_accuracy_calculator(recall_at_k=[1, 8])
    from pytorch_metric_learning.utils.inference import CustomKNN

    assert isinstance(calc.knn_func, CustomKNN)
    without = calc.get_accuracy(emb, labels)
    assert without == pytest.approx(with_faiss)


def test_bad_k_rejected():
    with pytest.raises(ValueError):
        make_accuracy_calculator(recall_at_k=[0, 1])


def test_query_gallery_split_properties():
    classes = np.repeat(np.arange(6), [1, 2, 3, 4, 5, 6])
    labels = np.stack([classes, classes % 2], axis=1)
    q, g = query_gallery_split(labels, 0.5, seed=0)
    assert len(np.intersect1d(q, g)) == 0
    assert np.array_equal(np.sort(np.concatenate([q, g])), np.arange(len(classes)))
    assert set(classes[q]) <= set(classes[g])  # every query has a same-class gallery item
    assert 0 not in set(classes[q])  # singleton class is gallery-only
    with pytest.raises(ValueError):
        query_gallery_split(labels, 1.0)
