import pytest
import torch
from torch.autograd import gradcheck

from pml_rank_plugins.functional.histogram import cpu as soft_histogram
from pml_rank_plugins.functional.histogram.cpu import (
    LabelCategories,
    pair_categories,
    pair_histograms,
    rows_per_chunk,
)

from ...reference_histogram_ap import dense_kernel


def dense_histograms(q, r, categories, offset, scale, num_intervals):
    """The L-bin formulation: every value against every centre (values clamped to the range)."""
    u = (offset + scale * (q @ r.T)).clamp(0, num_intervals)
    centres = torch.arange(num_intervals + 1, dtype=q.dtype)
    kernel = dense_kernel(u.unsqueeze(-1), centres, 1.0)  # (N, M, L + 1)
    pos = (kernel * (categories == 0).unsqueeze(-1)).sum(1)
    neg = (kernel * (categories == 1).unsqueeze(-1)).sum(1)
    return torch.stack([pos, neg], dim=1)


def random_inputs(n=9, m=11, d=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=1)
    r = torch.nn.functional.normalize(torch.randn(m, d, generator=gen, dtype=dtype), dim=1)
    categories = torch.randint(0, 3, (n, m), generator=gen, dtype=torch.int8)
    return q, r, categories


@pytest.mark.parametrize(
    "offset, scale, num_intervals",
    [
        (5.0, -5.0, 10),
        (1.5, -1.5, 3),
        (9.5, -9.5, 19),
        (0.5, -0.5, 1),
        (3.0, -4.0, 4),
        (45.0, -45.0, 90),
    ],
)
def test_two_bin_histogram_equals_dense_kernel(offset, scale, num_intervals):
    q, r, categories = random_inputs()
    got = pair_histograms(q, r, categories, offset, scale, num_intervals)
    want = dense_histograms(q, r, categories, offset, scale, num_intervals)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_values_on_centres_edges_and_outside_the_range():
    # Scores placing u exactly on centres, on both ends, and outside (saturating).
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    angles = torch.tensor([0.0, 0.3, 1.0, 2.0, 3.14159265358979], dtype=torch.float64)
    r = torch.stack([angles.cos(), angles.sin()], dim=1)
    categories = torch.zeros(1, 5, dtype=torch.int8)
    for offset, scale in [(2.0, -2.0), (2.5, -3.0)]:  # the second pushes values outside [0, L]
        got = pair_histograms(q, r, categories, offset, scale, 4)
        torch.testing.assert_close(got, dense_histograms(q, r, categories, offset, scale, 4))
        assert got[0, 0].sum().item() == pytest.approx(5.0)  # every value's weights sum to 1


@pytest.mark.parametrize("num_intervals", [4, 90])  # 90: column codes no longer fit in a byte
def test_gradcheck_float64(num_intervals):
    q, r, categories = random_inputs(n=5, m=6, d=3, seed=1)
    q.requires_grad_(True)
    r.requires_grad_(True)
    mix = torch.randn(5, 2, num_intervals + 1, dtype=torch.float64)
    half = num_intervals / 2

    def f(q, r):
        return (pair_histograms(q, r, categories, half, -half, num_intervals) * mix).sum()

    assert gradcheck(f, (q, r))


def test_self_ranking_accumulates_both_gradients():
    q, _, categories = random_inputs(n=6, m=6, d=3, seed=2)
    categories.fill_diagonal_(2)  # |x_i|^2 = 1 sits on the range's end, where the kernel has a kink
    q.requires_grad_(True)
    mix = torch.randn(6, 2, 5, dtype=torch.float64)
    assert gradcheck(lambda x: (pair_histograms(x, x, categories, 2.0, -2.0, 4) * mix).sum(), (q,))


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 100])
def test_chunking_changes_nothing(chunk_size):
    q, r, categories = random_inputs(n=9, m=7, d=4, seed=3)
    mix = torch.randn(9, 2, 11, dtype=torch.float64)
    results = []
    for size in (None, chunk_size):
        qq, rr = q.clone().requires_grad_(True), r.clone().requires_grad_(True)
        hist = pair_histograms(qq, rr, categories, 5.0, -5.0, 10, chunk_size=size)
        (hist * mix).sum().backward()
        results.append((hist, qq.grad, rr.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_pair_categories():
    pos = torch.tensor([[True, False, False]])
    neg = torch.tensor([[False, True, False]])
    assert pair_categories(pos, neg).tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="both positive and negative"):
        pair_categories(pos, pos)


def test_bad_arguments():
    q, r, categories = random_inputs()
    with pytest.raises(ValueError, match="num_intervals"):
        pair_histograms(q, r, categories, 0.0, 1.0, 0)
    with pytest.raises(ValueError, match="categories must have shape"):
        pair_histograms(q, r, categories[:, :3], 0.0, 1.0, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        pair_histograms(q, r, categories, 0.0, 1.0, 4, chunk_size=0)


def test_label_categories_equal_dense_masks_chunk_by_chunk():
    labels = torch.tensor([0, 1, 0, 2, 1, 1])
    ref_labels = torch.tensor([1, 0, 0, 2, 1, 1, 3])
    rows = torch.tensor([4, 0, 2])  # queries are batch rows 4, 0, 2; their self columns
    source = LabelCategories(labels[rows], ref_labels, self_columns=rows)
    pos = labels[rows].view(-1, 1) == ref_labels.view(1, -1)
    pos[torch.arange(3), rows] = False
    neg = labels[rows].view(-1, 1) != ref_labels.view(1, -1)
    neg[torch.arange(3), rows] = False
    dense = pair_categories(pos, neg)
    for start, stop in [(0, 3), (0, 1), (1, 3)]:
        assert torch.equal(source.rows(start, stop), dense[start:stop])
    q, r, _ = random_inputs(n=3, m=7)
    torch.testing.assert_close(
        pair_histograms(q, r, source, 5.0, -5.0, 10, chunk_size=2),
        pair_histograms(q, r, dense, 5.0, -5.0, 10),
    )


@pytest.mark.parametrize("offset, scale", [(2.5, -3.0), (-0.5, 3.0), (1.0, 4.0)])
def test_gradients_equal_dense_kernel_including_saturated_values(offset, scale):
    # With |scale| > offset range, many values fall outside [0, L]: they saturate into the end
    # bins and must get exactly zero gradient, as through the clamp of the dense formulation.
    q, r, categories = random_inputs(n=8, m=9, d=3, seed=4)
    mix = torch.randn(8, 2, 5, dtype=torch.float64)
    grads = []
    for histogram in (pair_histograms, dense_histograms):
        qq, rr = q.clone().requires_grad_(True), r.clone().requires_grad_(True)
        (histogram(qq, rr, categories, offset, scale, 4) * mix).sum().backward()
        grads.append((qq.grad, rr.grad))
    u = offset + scale * (q @ r.T)
    assert ((u < 0) | (u > 4)).any()  # the case really has saturated values
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_label_categories_accept_any_integer_labels():
    # Labels beyond int32 are remapped to dense ids before the chunk comparisons.
    big = 2**40
    labels = torch.tensor([big, big + 1, big, 7])
    source = LabelCategories(labels, labels, self_columns=torch.arange(4))
    want = pair_categories(
        (labels.view(-1, 1) == labels.view(1, -1)) & ~torch.eye(4, dtype=torch.bool),
        labels.view(-1, 1) != labels.view(1, -1),
    )
    assert torch.equal(source.rows(0, 4), want)


def test_default_chunk_rows():
    assert rows_per_chunk(4096, 1024) == 256  # 256K scores
    assert rows_per_chunk(16384, 16384) == 128  # at least 128 rows for the matmul
    assert rows_per_chunk(100, 16384) == 100  # never more than the queries
    assert rows_per_chunk(4096, 1 << 20) == 4  # 4M-score ceiling for huge reference sets
    assert rows_per_chunk(4096, 1 << 30) == 1
    assert rows_per_chunk(10, 10, chunk_size=3) == 3


def blocked(monkeypatch, cache_elements=8, min_columns=3):
    """Shrinks the column blocks (see soft_histogram.column_block) to a few columns."""
    monkeypatch.setattr(soft_histogram, "CACHE_CHUNK_ELEMENTS", cache_elements)
    monkeypatch.setattr(soft_histogram, "MIN_BLOCK_COLUMNS", min_columns)


def test_column_block_splits_only_wide_chunks(monkeypatch):
    assert soft_histogram.column_block(128, 4096) == 4096  # 512K pairs: one block
    assert soft_histogram.column_block(64, 65536) == 4096  # the memory-bank shape: 16 blocks
    assert soft_histogram.column_block(128, 16384) == 4096
    blocked(monkeypatch)
    assert soft_histogram.column_block(2, 8) == 8  # 16 pairs fit in 2 x 8: one block
    assert soft_histogram.column_block(2, 13) == 4  # 8 // 2 columns
    assert soft_histogram.column_block(5, 11) == 3  # at least MIN_BLOCK_COLUMNS


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_column_blocks_change_nothing_and_equal_the_dense_kernel(monkeypatch, chunk_size):
    q, r, categories = random_inputs(n=9, m=13, d=4, seed=5)
    mix = torch.randn(9, 2, 11, dtype=torch.float64)
    results = []
    for shrink in (False, True):
        if shrink:
            blocked(monkeypatch)
            assert soft_histogram.column_block(min(chunk_size or 9, 9), 13) < 13
        qq, rr = q.clone().requires_grad_(True), r.clone().requires_grad_(True)
        hist = pair_histograms(qq, rr, categories, 5.0, -5.0, 10, chunk_size=chunk_size)
        (hist * mix).sum().backward()
        results.append((hist, qq.grad, rr.grad))
    want = dense_histograms(q, r, categories, 5.0, -5.0, 10)
    torch.testing.assert_close(results[1][0], want, rtol=0, atol=1e-12)
    # Same additions in the same order; a block's product may round its last bit differently.
    for a, b in zip(results[0], results[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_column_blocks_gradcheck_float64(monkeypatch):
    blocked(monkeypatch)
    q, r, categories = random_inputs(n=5, m=9, d=3, seed=6)
    q.requires_grad_(True)
    r.requires_grad_(True)
    mix = torch.randn(5, 2, 5, dtype=torch.float64)
    assert soft_histogram.column_block(5, 9) < 9
    assert gradcheck(lambda q, r: (pair_histograms(q, r, categories, 2, -2, 4) * mix).sum(), (q, r))
