"""map_chunks spreads chunks over threads (one torch thread each) and the chunked kernels give
the same values and gradients on threads as in one thread, identical from call to call."""

import threading

import pytest
import torch

from pml_rank_plugins.functional.chunk_threads import ExclusiveRows, chunk_workers, map_chunks
from pml_rank_plugins.functional.chunking import DenseCategories, LabelCategories
from pml_rank_plugins.functional.histogram.cpu import pair_histograms
from pml_rank_plugins.functional.ranked_list import cpu as ranked_list_chunked
from pml_rank_plugins.functional.ranked_list.cpu import (
    chunked_ranked_list_mining,
    chunked_ranked_list_terms,
)

# torch's CPU threads: on the CPU whatever TEST_DEVICE (tests/conftest.py)
pytestmark = pytest.mark.cpu_only


def in_one_thread(fn):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def test_results_in_index_order_each_chunk_once_with_one_torch_thread(two_threads):
    seen = []

    def work(index, worker):
        seen.append((index, torch.get_num_threads(), threading.get_ident()))
        return index * 10 + worker * 0

    assert map_chunks(work, 9, workers=2) == [index * 10 for index in range(9)]
    assert sorted(index for index, _, _ in seen) == list(range(9))
    assert {threads for _, threads, _ in seen} == {1}
    assert torch.get_num_threads() == 2  # restored


def test_one_worker_runs_in_this_thread_with_torch_threads_unchanged(two_threads):
    seen = map_chunks(lambda i, w: (w, torch.get_num_threads(), threading.get_ident()), 3, 1)
    assert seen == [(0, 2, threading.get_ident())] * 3


def test_grad_mode_of_the_caller_reaches_the_workers(two_threads):
    with torch.no_grad():
        modes = map_chunks(lambda i, w: torch.is_grad_enabled(), 4, workers=2)
    assert modes == [False] * 4
    assert map_chunks(lambda i, w: torch.is_grad_enabled(), 4, workers=2) == [True] * 4


def test_an_error_in_a_chunk_is_raised_and_threads_restored(two_threads):
    def work(index, worker):
        if index == 3:
            raise KeyError("chunk 3")
        return index

    with pytest.raises(KeyError, match="chunk 3"):
        map_chunks(work, 50, workers=2)
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="workers must be >= 1"):
        map_chunks(work, 2, workers=0)


def test_chunk_workers_cpu_threads_bounded_by_chunks_one_elsewhere(two_threads):
    assert chunk_workers(10, torch.device("cpu")) == 2
    assert chunk_workers(1, torch.device("cpu")) == 1
    assert chunk_workers(10, torch.device("meta")) == 1


def test_exclusive_rows_copies_survive_another_workers_call():
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    source = LabelCategories(labels, labels, torch.arange(6))
    rows = ExclusiveRows(source, workers=2)
    first = rows.rows(0, 2, worker=0).clone()
    kept = rows.rows(0, 2, worker=0)
    rows.rows(4, 6, worker=1)  # the source reuses one buffer; the worker copies must not change
    assert torch.equal(kept, first)
    assert torch.equal(first, LabelCategories(labels, labels, torch.arange(6)).rows(0, 2))


def test_exclusive_rows_of_dense_categories_are_views_and_labels_fill_each_workers_buffer():
    dense = DenseCategories(torch.randint(0, 3, (6, 4), dtype=torch.int8))
    rows = ExclusiveRows(dense, workers=2)
    assert rows.rows(2, 4, worker=1).data_ptr() == dense.categories[2:4].data_ptr()
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    source = LabelCategories(labels, labels, torch.arange(6))
    rows = ExclusiveRows(source, workers=2)
    first, second = rows.rows(0, 2, worker=0), rows.rows(2, 4, worker=1)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(second, LabelCategories(labels, labels, torch.arange(6)).rows(2, 4))


def histogram_grads(q, r, categories):
    q, r = q.clone().requires_grad_(), r.clone().requires_grad_()
    hist = pair_histograms(q, r, categories, 2.0, 3.0, 6, chunk_size=5)
    (hist * torch.linspace(-1, 1, hist.numel(), dtype=hist.dtype).view_as(hist)).sum().backward()
    return hist.detach(), q.grad, r.grad


def test_pair_histograms_on_threads_equal_one_thread_and_repeat_exactly(two_threads):
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(37, 8, dtype=torch.float64), dim=1)
    r = torch.nn.functional.normalize(torch.randn(29, 8, dtype=torch.float64), dim=1)
    categories = torch.randint(0, 3, (37, 29), dtype=torch.int8)
    threaded = histogram_grads(q, r, categories)
    again = histogram_grads(q, r, categories)
    single = in_one_thread(lambda: histogram_grads(q, r, categories))
    for a, b, c in zip(threaded, again, single):
        assert torch.equal(a, b)  # deterministic: no cross-thread sums
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


def rll_grads(q, r, categories):
    q, r = q.clone().requires_grad_(), r.clone().requires_grad_()
    terms = chunked_ranked_list_terms(q, r, categories, alpha=1.2, margin=0.4, chunk_size=4)
    (terms.loss * torch.linspace(0.5, 1.5, len(q), dtype=q.dtype)).sum().backward()
    return terms.loss.detach(), terms.num_pos, terms.num_neg, q.grad, r.grad


@pytest.mark.parametrize("sparse_fraction", [0.0, 1.0])  # every chunk dense / every chunk sparse
def test_ranked_list_on_threads_equals_one_thread_and_repeats_exactly(
    two_threads, monkeypatch, sparse_fraction
):
    monkeypatch.setattr(ranked_list_chunked, "SPARSE_FRACTION", sparse_fraction)
    torch.manual_seed(1)
    q = 0.6 * torch.nn.functional.normalize(torch.randn(30, 6, dtype=torch.float64), dim=1)
    r = 0.6 * torch.nn.functional.normalize(torch.randn(26, 6, dtype=torch.float64), dim=1)
    labels, ref_labels = torch.arange(30) % 5, torch.arange(26) % 5
    categories = LabelCategories(labels, ref_labels)
    threaded = rll_grads(q, r, categories)
    again = rll_grads(q, r, categories)
    single = in_one_thread(lambda: rll_grads(q, r, categories))
    assert int(threaded[1].sum()) > 0 and int(threaded[2].sum()) > 0  # both kinds mined
    for a, b, c in zip(threaded, again, single):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    mined = in_one_thread(lambda: chunked_ranked_list_mining(q, r, categories, chunk_size=4))
    for a, b in zip(chunked_ranked_list_mining(q, r, categories, chunk_size=4), mined):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_inference_mode_of_the_caller_reaches_the_workers(two_threads):
    with torch.inference_mode():
        modes = map_chunks(lambda i, w: torch.is_inference_mode_enabled(), 4, workers=2)
    assert modes == [True] * 4
    assert map_chunks(lambda i, w: torch.is_inference_mode_enabled(), 4, workers=2) == [False] * 4


@pytest.mark.parametrize("loss_name", ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss"])
def test_losses_on_threads_under_inference_mode_equal_no_grad(two_threads, loss_name):
    # Buffers created under inference mode are inference tensors; the worker threads update them
    # in place, which fails unless they run in inference mode too.
    from pml_rank_plugins import losses

    loss_fn = getattr(losses, loss_name)(chunk_size=8)
    torch.manual_seed(2)
    x = torch.nn.functional.normalize(torch.randn(64, 8, dtype=torch.float64), dim=1)
    y = torch.arange(64) // 4
    with torch.no_grad():
        expected = loss_fn(x, y)
    with torch.inference_mode():
        value = loss_fn(x, y)
    assert torch.equal(value, expected) and float(expected) > 0


@pytest.mark.parametrize("loss_name", ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss"])
def test_losses_on_threads_under_autocast_equal_float32(two_threads, loss_name):
    # Autocast is thread-local and not passed to the helpers: the kernels must not depend on it,
    # or a chunk's result would depend on the thread that ran it.
    from pml_rank_plugins import losses

    loss_fn = getattr(losses, loss_name)(chunk_size=16)
    torch.manual_seed(3)
    x = torch.nn.functional.normalize(torch.randn(256, 16), dim=1).requires_grad_()
    y = torch.arange(256) // 4
    expected = loss_fn(x, y)
    (expected_grad,) = torch.autograd.grad(expected, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss_fn(x, y)
    (grad,) = torch.autograd.grad(value, x)
    assert value.dtype == torch.float32
    assert torch.equal(value, expected) and torch.equal(grad, expected_grad)
