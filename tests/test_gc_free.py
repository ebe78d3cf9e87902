"""tests/gc_free.py: explicit ``gc.collect()`` calls are skipped only inside its block, and the
Holm adjustment (statsmodels', which calls it) gives the same values."""

from __future__ import annotations

import gc

import pytest
from statsmodels.stats.multitest import multipletests

from tests.gc_free import gc_collect_skipped


def test_gc_collect_skipped_only_inside_its_block_and_holm_unchanged():
    real = gc.collect
    pvalues = [0.01, 0.04, 0.03, 0.2]
    want = multipletests(pvalues, method="holm")[1]
    with gc_collect_skipped():
        assert gc.collect is not real and gc.collect() == 0
        got = multipletests(pvalues, method="holm")[1]
    assert gc.collect is real
    assert list(got) == list(want)
    # Holm by hand: sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1, running maximum
    assert list(got) == pytest.approx([0.04, 0.09, 0.09, 0.2])
