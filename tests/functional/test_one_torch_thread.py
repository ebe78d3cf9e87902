"""one_torch_thread / one_thread_apply: the glue around the chunked kernels runs on one torch
thread, forward and backward, while the chunks keep the caller's thread count; values and
gradients are those of the plain calls, and torch's thread count is restored."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance

from pml_rank_plugins.functional import chunk_threads, validation
from pml_rank_plugins.functional.backend import ENV_VAR
from pml_rank_plugins.functional.chunk_threads import (
    GLUE_MAX_ELEMENTS,
    chunk_workers,
    glue_elements,
    one_thread_apply,
    one_torch_thread,
)
from pml_rank_plugins.functional.histogram import cpu as soft_histogram
from pml_rank_plugins.functional.screened_inputs import normalize_rows_screened
from pml_rank_plugins.functional.validation import normalize_rows
from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.losses import ranked_list as ranked_list_loss_module
from pml_rank_plugins.utils import loss_and_miner_utils

# torch's CPU threads: on the CPU whatever TEST_DEVICE (tests/conftest.py)
pytestmark = pytest.mark.cpu_only

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch):
    """These tests are about the ``cpu`` backend, which ``auto`` picks on the CPU: an exported
    ``PML_RANK_BACKEND`` (e.g. ``gpu``, to run the suite on the sync-free path) must not change
    what they check."""
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_one_thread_inside_the_callers_count_for_the_chunks_restored_after(two_threads):
    with one_torch_thread(CPU, 0):
        assert torch.get_num_threads() == 1
        assert chunk_workers(8, CPU) == 2
        with one_torch_thread(CPU, 0):  # nested: no change
            assert torch.get_num_threads() == 1 and chunk_workers(8, CPU) == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2 and chunk_workers(8, CPU) == 2


def test_restored_after_an_error_and_untouched_on_other_devices(two_threads):
    with pytest.raises(RuntimeError, match="boom"):
        with one_torch_thread(CPU, 0):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2
    assert getattr(chunk_threads._caller, "threads", None) is None
    with one_torch_thread(torch.device("cuda"), 0):  # a device object only: nothing runs on it
        assert torch.get_num_threads() == 2


def test_large_glue_keeps_the_callers_threads(two_threads):
    with one_torch_thread(CPU, GLUE_MAX_ELEMENTS):
        assert torch.get_num_threads() == 1
    with one_torch_thread(CPU, GLUE_MAX_ELEMENTS + 1):
        assert torch.get_num_threads() == 2
    queries, memory = torch.zeros(256, 128), torch.zeros(65536, 128)
    assert glue_elements(queries, memory) == 65536 * 128 > GLUE_MAX_ELEMENTS
    assert glue_elements(queries, queries) == 256 * 128
    assert glue_elements(queries, queries[:100], dense_pairs=True) == 256 * 128
    assert glue_elements(queries, torch.zeros(1000, 128), dense_pairs=True) == 256 * 1000
    seen = []
    big = torch.randn(GLUE_MAX_ELEMENTS // 4 + 1, 4, requires_grad=True)
    out = one_thread_apply(_recorded(normalize_rows, seen), big)
    assert seen == [2] and out.grad_fn is not None  # a plain call on the caller's threads


def _recorded(fn, seen):
    def wrapper(*args):
        seen.append(torch.get_num_threads())
        return fn(*args)

    return wrapper


def test_apply_gives_the_plain_calls_values_and_gradients_bit_for_bit(two_threads):
    torch.manual_seed(0)
    x = torch.randn(300, 64)
    x[3] = 0.0  # a zero row: zero gradient, as normalize_rows gives it
    g = torch.randn(300, 64)
    direct = x.clone().requires_grad_()
    expected = normalize_rows(direct)
    expected.backward(g)
    seen = []
    wrapped = x.clone().requires_grad_()
    got = one_thread_apply(_recorded(normalize_rows, seen), wrapped)
    got.backward(g)
    assert torch.equal(got, expected) and torch.equal(wrapped.grad, direct.grad)
    assert wrapped.grad[3].abs().sum() == 0
    assert seen == [1, 1]  # forward, then the backward's recomputation: one thread each
    assert torch.get_num_threads() == 2


def test_apply_gradcheck_float64_with_an_input_that_needs_no_gradient():
    torch.manual_seed(1)
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    const = torch.randn(5, 3, dtype=torch.float64)
    fn = lambda a, b, c: (normalize_rows(a) * b + c).cumsum(1)  # noqa: E731
    assert torch.autograd.gradcheck(lambda a, b: one_thread_apply(fn, a, b, const), (a, b))
    # an input the function ignores gets no gradient (None), not an error
    out = one_thread_apply(lambda a, b: a * 2, a, b)
    out.sum().backward()
    assert b.grad is None and torch.equal(a.grad, torch.full_like(a, 2.0))


def test_apply_double_backward_and_a_plain_call_without_grad(two_threads):
    torch.manual_seed(4)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: one_thread_apply(normalize_rows, x), (x,))
    seen = []
    with torch.no_grad():
        plain = one_thread_apply(_recorded(normalize_rows, seen), x)
    assert plain.grad_fn is None and seen == [1]
    assert torch.equal(plain, normalize_rows(x.detach()))


def _histogram_loss_threads(loss, monkeypatch):
    """Torch thread counts seen by the normalization, the AP glue and the kernel's map_chunks
    during one forward + backward of ``loss``."""
    seen = {"normalize": [], "ap": [], "workers": []}
    monkeypatch.setattr(validation, "normalize_rows", _recorded(normalize_rows, seen["normalize"]))
    monkeypatch.setattr(loss, "_average_precision", _recorded(loss._average_precision, seen["ap"]))
    map_chunks = soft_histogram.map_chunks

    def recording_map_chunks(work, count, workers):
        seen["workers"].append((workers, torch.get_num_threads()))
        return map_chunks(work, count, workers)

    monkeypatch.setattr(soft_histogram, "map_chunks", recording_map_chunks)
    torch.manual_seed(2)
    x = torch.randn(256, 16, requires_grad=True)
    labels = torch.arange(256) // 4
    loss.chunk_size = 32
    loss(x, labels).backward()
    return seen


@pytest.mark.parametrize("loss_class", [FastAPLoss, QuantizedAPLoss])
def test_histogram_losses_run_their_glue_on_one_thread_and_chunks_on_the_callers(
    two_threads, monkeypatch, loss_class
):
    seen = _histogram_loss_threads(loss_class(), monkeypatch)
    assert seen["normalize"] == [1, 1]  # forward and the backward's recomputation
    assert seen["ap"] == [1, 1]
    # every kernel pass is called with torch at one thread; the forward's and the query
    # gradient's 8 chunks get the caller's 2 workers (the reference gradient: one block, 1)
    assert all(threads == 1 for _, threads in seen["workers"])
    assert [workers for workers, _ in seen["workers"][:2]] == [2, 2]
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_ranked_list_runs_its_normalization_on_one_thread(
    two_threads, monkeypatch, gallery_gradient
):
    seen = []
    # The cpu path normalizes through losses.ranked_list.SCREENED_NORMALIZE (one_thread_apply of
    # the screened normalize_rows); the recorder sits inside one_thread_apply, where it runs.
    screened = partial(one_thread_apply, _recorded(normalize_rows_screened, seen))
    monkeypatch.setattr(ranked_list_loss_module, "SCREENED_NORMALIZE", screened)
    monkeypatch.setattr(loss_and_miner_utils, "normalize_rows", _recorded(normalize_rows, seen))
    loss = RankedListLoss(gallery_gradient=gallery_gradient, chunk_size=32)
    assert type(loss.distance) is LpDistance and loss.distance.normalize_embeddings
    torch.manual_seed(3)
    x = torch.randn(256, 16, requires_grad=True)
    loss(x, torch.arange(256) // 4).backward()
    assert seen == [1, 1] and torch.get_num_threads() == 2
    assert x.grad.abs().sum() > 0
