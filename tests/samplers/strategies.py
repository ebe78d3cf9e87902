"""Hypothesis strategies for random two-level label structures and shared sampler helpers."""

from __future__ import annotations

import re
import warnings

import numpy as np
from hypothesis import strategies as st


@st.composite
def two_level_labels(draw, min_categories=2, max_categories=5, unlabeled=False):
    """(N, 2) labels: categories of 1-8 classes with 1-7 items each, in shuffled order."""
    num_categories = draw(st.integers(min_categories, max_categories))
    rows = []
    next_class = 0
    for category in range(num_categories):
        sizes = draw(st.lists(st.integers(1, 7), min_size=1, max_size=8))
        for size in sizes:
            rows += [(next_class, category)] * size
            next_class += 1
    if unlabeled:
        for size in draw(st.lists(st.integers(1, 6), min_size=1, max_size=10)):
            rows += [(next_class, -1)] * size
            next_class += 1
    labels = np.array(rows, dtype=np.int64)
    perm = np.random.default_rng(draw(st.integers(0, 2**16))).permutation(len(labels))
    return labels[perm]


def check_batch_invariants(batch, labels, batch_size):
    """Exact size, no duplicate index, every class present has >= 2 items. Returns the classes."""
    assert len(batch) == batch_size
    assert len(set(batch)) == batch_size
    classes, counts = np.unique(labels[batch, 0], return_counts=True)
    assert counts.min() >= 2, f"class with a single item in batch: {dict(zip(classes, counts))}"
    return classes


def build_or_none(sampler_class, labels, batch_size, refusal, **kwargs):
    """``sampler_class(labels, batch_size=batch_size, **kwargs)`` with warnings silenced, or ``None`` when it
    raises a ``ValueError`` whose message matches the regex ``refusal`` (a label structure that
    cannot serve this batch size); any other error propagates."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sampler_class(labels, batch_size=batch_size, **kwargs)
    except ValueError as error:
        assert re.search(refusal, str(error)), str(error)
        return None
