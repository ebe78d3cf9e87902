"""The host-overhead cuts of issue 39 against the paths they replace: dense label counts, the
Ranked List diagonal pairs, ``inverse_or_zero``, ``autocast_off``, the bin columns kept from
forward for a small one-chunk backward."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional.histogram import gpu, sync_free
from pml_rank_plugins.functional.ranked_list import gpu_steps as steps
from pml_rank_plugins.functional.sync_free_inputs import autocast_off


def test_dense_and_sorted_label_counts_agree(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 5, (23,), generator=generator)
    ref_labels = torch.randint(0, 7, (31,), generator=generator).to(torch.int32)
    for exclude_own, refs in ((False, ref_labels), (True, labels)):
        dense = sync_free.label_counts(labels, refs, exclude_own)
        monkeypatch.setattr(sync_free, "DENSE_COUNT_PAIRS", 0)  # force the sorted path
        sorted_ = sync_free.label_counts(labels, refs, exclude_own)
        monkeypatch.undo()
        for a, b in zip(dense, sorted_):
            assert torch.equal(a, b)
    # against a loop: ref_labels has a class the queries lack, and some queries lack positives
    num_pos, valid, ranked = sync_free.label_counts(labels, ref_labels, False)
    for i, label in enumerate(labels.tolist()):
        same = sum(int(r == label) for r in ref_labels.tolist())
        assert num_pos[i] == same and bool(valid[i]) == (same > 0)
        assert bool(ranked[i]) == (same > 0 and same < len(ref_labels))


def test_ranked_list_diagonal_pairs_equal_explicit_self_columns():
    labels = torch.tensor([0, 0, 1, 1, 2, 0, 1])
    explicit = steps.LabelPairs(labels, labels, torch.arange(len(labels)))
    diagonal = steps.LabelPairs(labels, labels, diagonal=True)
    for start, stop in ((0, 7), (2, 5), (5, 7)):
        for a, b in zip(explicit.candidates(start, stop), diagonal.candidates(start, stop)):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        steps.LabelPairs(labels, labels, torch.arange(7), diagonal=True)


def test_inverse_or_zero_keeps_nan_and_zeroes_empty_rows():
    total = torch.tensor([0.0, 1.0, 4.0, float("nan"), float("inf")], dtype=torch.float64)
    got = steps.inverse_or_zero(total)
    expected = torch.tensor([0.0, 1.0, 0.25, float("nan"), 0.0], dtype=torch.float64)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())


def test_autocast_off_turns_autocast_off_only_where_it_is_on():
    x = torch.randn(4, 4)
    kind = x.device.type  # the test device's autocast (a CPU autocast leaves CUDA tensors be)
    with autocast_off(kind):
        assert (x @ x).dtype == torch.float32
    with torch.autocast(kind, dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
        with autocast_off(kind):
            assert not torch.is_autocast_enabled(kind)
            assert (x @ x).dtype == torch.float32
        assert torch.is_autocast_enabled(kind)


@pytest.mark.parametrize("diagonal", [True, False])
def test_kept_bin_columns_give_the_recomputed_gradient(monkeypatch, diagonal):
    generator = torch.Generator().manual_seed(5)
    x = torch.nn.functional.normalize(torch.randn(12, 6, generator=generator, dtype=torch.float64))
    labels = torch.arange(12) // 3
    own = None if diagonal else torch.randperm(12, generator=generator)
    grad_hist = torch.randn(12, 2, 11, generator=generator, dtype=torch.float64)

    def gradients():
        q = x.clone().requires_grad_(True)
        r = q if diagonal else x.flip(0).clone().requires_grad_(True)
        pairs = gpu.LabelPairs(labels, labels, own, diagonal=diagonal)
        hist = gpu.pair_histograms(q, r, pairs, 5.0, -5.0, 10)
        (hist * grad_hist).sum().backward()
        return hist, q.grad, None if diagonal else r.grad

    kept = gradients()
    monkeypatch.setattr(gpu, "SAVED_INDEX_PAIRS", 0)  # recompute the columns in backward
    recomputed = gradients()
    for a, b in zip(kept, recomputed):
        assert (a is None and b is None) or torch.equal(a, b)
