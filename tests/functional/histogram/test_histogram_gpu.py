"""The gpu backend of the soft-histogram kernel (functional/histogram/gpu.py) against the CPU
kernel (functional/histogram/cpu.py): values and gradients (float64 gradcheck, float32 close),
several chunks from a patched budget, chunk_size, the chunk decision reused by backward, no
syncing operator, bad inputs; and the dispatch point (functional/histogram/dispatch.py)."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import ENV_VAR, use_backend
from pml_rank_plugins.functional.histogram import cpu as soft_histogram
from pml_rank_plugins.functional.histogram import dispatch, gpu, triton_kernel
from pml_rank_plugins.utils.op_count import OpCounter

OFFSET, SCALE, L = 5.0, -5.0, 10  # FastAP with 10 bins: u = 5 - 5 s


def unit(n, d=5, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1).to(dtype).requires_grad_()


def labels(n, classes=4, seed=1):
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


def both(q, r, lab, ref_lab, self_columns=None, chunk_size=None, diagonal=False):
    """(cpu histograms, gpu histograms) of the same pairs."""
    cpu_columns = torch.arange(len(lab)) if diagonal else self_columns
    cpu = soft_histogram.pair_histograms(
        q, r, chunking.LabelCategories(lab, ref_lab, cpu_columns), OFFSET, SCALE, L, chunk_size
    )
    source = gpu.LabelPairs(lab, ref_lab, self_columns, diagonal=diagonal)
    return cpu, gpu.pair_histograms(q, r, source, OFFSET, SCALE, L, chunk_size)


def grads(hist, inputs, seed=2):
    weights = torch.randn(hist.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((hist * weights.to(hist.dtype)).sum(), inputs)


@pytest.fixture
def budget(monkeypatch):
    """Set the GPU chunk budget in bytes (the one function the rule reads)."""

    def set_budget(value):
        monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: value)

    return set_budget


@pytest.mark.parametrize("chunk_size", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gpu_equals_cpu_with_references(chunk_size, dtype):
    q, r = unit(37, dtype=dtype), unit(23, dtype=dtype, seed=3)
    lab, ref_lab = labels(37), labels(23, seed=4)
    own = torch.randint(0, 23, (37,), generator=torch.Generator().manual_seed(5))
    cpu, ours = both(q, r, lab, ref_lab, own, chunk_size)
    tol = {"atol": 1e-12, "rtol": 1e-12} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(ours, cpu, **tol)
    for a, b in zip(grads(ours, (q, r)), grads(cpu, (q, r))):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_gpu_equals_cpu_against_itself(chunk_size):
    q = unit(29)
    lab = labels(29)
    cpu, ours = both(q, q, lab, lab, chunk_size=chunk_size, diagonal=True)
    torch.testing.assert_close(ours, cpu, atol=1e-12, rtol=0)
    torch.testing.assert_close(grads(ours, q)[0], grads(cpu, q)[0], atol=1e-12, rtol=1e-12)


def test_dense_categories_and_bin_edges():
    # Scores exactly on bin centres and edges, and outside [-1, 1] (clamped, zero gradient).
    q = torch.tensor([[1.0, 0.0], [0.6, 0.8], [-1.0, 0.0]], dtype=torch.float64)
    r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6], [-1.0, 0.0]], dtype=torch.float64)
    r = (r * 1.2).requires_grad_()  # |s| up to 1.2: clamped values on both sides
    q.requires_grad_()
    cats = torch.tensor([[0, 1, 2, 1], [1, 0, 1, 0], [2, 1, 0, 0]], dtype=torch.int8)
    cpu = soft_histogram.pair_histograms(q, r, cats, OFFSET, SCALE, L)
    ours = gpu.pair_histograms(q, r, cats, OFFSET, SCALE, L)
    torch.testing.assert_close(ours, cpu, atol=1e-12, rtol=0)
    for a, b in zip(grads(ours, (q, r)), grads(cpu, (q, r))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_gradcheck_float64_several_chunks():
    q, r = unit(9, d=3), unit(7, d=3, seed=3)
    source = gpu.LabelPairs(labels(9, 3), labels(7, 3, seed=4))
    assert torch.autograd.gradcheck(
        lambda a, b: gpu.pair_histograms(a, b, source, OFFSET, SCALE, L, 4), (q, r)
    )
    own = gpu.LabelPairs(labels(9, 3), labels(9, 3), diagonal=True)
    assert torch.autograd.gradcheck(
        lambda a: gpu.pair_histograms(a, a, own, OFFSET, SCALE, L), (q,)
    )


def test_budget_chunks_equal_one_chunk(budget):
    q, r = unit(40), unit(30, seed=3)
    source = gpu.LabelPairs(labels(40), labels(30, seed=4))
    whole = gpu.pair_histograms(q, r, source, OFFSET, SCALE, L)
    # 17 bytes a float32 pair, 25 a float64 one: 25 * 30 * 6 bytes hold 6 rows a chunk.
    assert gpu.bytes_per_pair(torch.float64) == 25 and gpu.bytes_per_pair(torch.float32) == 17
    budget(25 * 30 * 6)
    assert chunking.rows_per_chunk(40, 30, bytes_per_pair=25) == 6
    chunked = gpu.pair_histograms(q, r, source, OFFSET, SCALE, L)
    torch.testing.assert_close(chunked, whole, atol=1e-12, rtol=0)
    for a, b in zip(grads(chunked, (q, r)), grads(whole, (q, r))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_backward_reuses_the_forward_chunks(budget):
    q, r = unit(40), unit(30, seed=3)
    source = gpu.LabelPairs(labels(40), labels(30, seed=4))
    budget(25 * 30 * 6)  # 7 chunks of 6 rows (the last of 4)
    with OpCounter() as forward:
        hist = gpu.pair_histograms(q, r, source, OFFSET, SCALE, L)
    budget(1 << 30)  # a later budget must not change the backward's chunks
    with OpCounter() as backward:
        hist.sum().backward()
    assert forward.counts["addmm"] == 7 and forward.counts["scatter_add_"] == 14
    assert backward.counts["gather"] == 7
    with OpCounter() as override:
        gpu.pair_histograms(q, r, source, OFFSET, SCALE, L, chunk_size=20).sum().backward()
    assert override.counts["gather"] == 2


def test_no_syncing_operator_forward_and_backward():
    q, r = unit(30), unit(20, seed=3)
    lab, ref_lab = labels(30), labels(20, seed=4)
    own = torch.randint(0, 20, (30,), generator=torch.Generator().manual_seed(5))
    dense = torch.randint(0, 3, (30, 20), generator=torch.Generator().manual_seed(6))
    for source in (gpu.LabelPairs(lab, ref_lab, own), dense.to(torch.int8)):
        with OpCounter(forbid_syncs=True) as ops:
            gpu.pair_histograms(q, r, source, OFFSET, SCALE, L, chunk_size=8).sum().backward()
        assert ops.syncs == 0


def test_label_pairs_equal_label_categories():
    lab, ref_lab = labels(12), labels(9, seed=4)
    own = torch.randint(0, 9, (12,), generator=torch.Generator().manual_seed(5))
    expected = chunking.LabelCategories(lab, ref_lab, own).rows(2, 10).clone()
    assert torch.equal(gpu.LabelPairs(lab, ref_lab, own).rows(2, 10), expected)
    square = chunking.LabelCategories(lab, lab, torch.arange(12)).rows(3, 12).clone()
    assert torch.equal(gpu.LabelPairs(lab, lab, diagonal=True).rows(3, 12), square)
    assert torch.equal(gpu.LabelPairs(lab, lab, diagonal=True).self_columns, torch.arange(12))
    with pytest.raises(ValueError, match="not both"):
        gpu.LabelPairs(lab, lab, torch.arange(12), diagonal=True)


@pytest.mark.parametrize(
    "queries, refs, categories, message",
    [
        (torch.zeros(4), torch.zeros(3, 2), torch.zeros(4, 3), "queries must be a 2-D"),
        (torch.zeros(4, 2), torch.zeros(3, 2, dtype=torch.int64), None, "refs must be a 2-D"),
        (torch.zeros(4, 2), torch.zeros(3, 5), None, "refs have 5 columns, queries 2"),
        (torch.zeros(4, 2), torch.zeros(3, 2, dtype=torch.float64), None, "share dtype"),
        (torch.zeros(4, 2), torch.zeros(3, 2), torch.zeros(3, 4), r"shape \(4, 3\)"),
        (torch.zeros(4, 2), torch.zeros(3, 2), torch.zeros(4, 3), "integer tensor"),
    ],
)
def test_bad_inputs_are_named(queries, refs, categories, message):
    categories = torch.zeros(4, 3, dtype=torch.int8) if categories is None else categories
    with pytest.raises(ValueError, match=message):
        gpu.pair_histograms(queries, refs, categories, OFFSET, SCALE, L)
    with pytest.raises(ValueError, match="num_intervals must be >= 1"):
        gpu.pair_histograms(torch.zeros(4, 2), torch.zeros(3, 2), categories, OFFSET, SCALE, 0)


def test_float32_matmul_leaves_the_cpu_alone():
    before = torch.backends.cuda.matmul.fp32_precision
    with gpu.float32_matmul(torch.device("cpu")):
        assert torch.backends.cuda.matmul.fp32_precision == before
    assert torch.backends.cuda.matmul.fp32_precision == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_float32_matmul_pins_ieee_on_cuda_and_restores():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        with gpu.float32_matmul(torch.device("cuda")):
            assert matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = before


def test_float32_matmul_is_a_no_op_while_compiling():
    """Asked for CUDA while dynamo traces (run here on CPU tensors, the branch is the device's
    type): no read or write of ``fp32_precision``, which dynamo refuses (a graph break that
    ``fullgraph=True`` raises); the flag is untouched."""
    before = torch.backends.cuda.matmul.fp32_precision

    def product(x):
        with gpu.float32_matmul(torch.device("cuda")):
            return x @ x.T

    torch._dynamo.reset()
    x = unit(6)
    compiled = torch.compile(product, fullgraph=True, backend="eager")
    try:
        assert torch.equal(compiled(x), x @ x.T)
    finally:
        torch._dynamo.reset()
    assert torch.backends.cuda.matmul.fp32_precision == before


def test_deterministic_algorithms_run():
    q, r = unit(20), unit(15, seed=3)
    source = gpu.LabelPairs(labels(20), labels(15, seed=4))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = gpu.pair_histograms(q, r, source, OFFSET, SCALE, L, 6)
        again = gpu.pair_histograms(q, r, source, OFFSET, SCALE, L, 6)
        grad_a, grad_b = grads(first, (q, r)), grads(again, (q, r))
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(first, again)
    assert all(torch.equal(a, b) for a, b in zip(grad_a, grad_b))


# -- dispatch -----------------------------------------------------------------------------------


def test_dispatch_cpu_is_the_cpu_kernel_bit_for_bit(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    q, r = unit(30, dtype=torch.float32), unit(20, dtype=torch.float32, seed=3)
    source = chunking.LabelCategories(labels(30), labels(20, seed=4))
    expected = soft_histogram.pair_histograms(q, r, source, OFFSET, SCALE, L)
    expected_grad = grads(expected, (q, r))
    # None / "auto" resolve to cpu on the CPU only (to gpu on CUDA: test_dispatch_gpu_...)
    auto = (None, "auto") if q.device.type == "cpu" else ()
    for backend in ("cpu", *auto):
        hist = dispatch.pair_histograms(q, r, source, OFFSET, SCALE, L, backend=backend)
        assert torch.equal(hist, expected)
        assert all(torch.equal(a, b) for a, b in zip(grads(hist, (q, r)), expected_grad))


def test_dispatch_gpu_by_keyword_context_and_variable(monkeypatch):
    q, r = unit(30), unit(20, seed=3)
    source = gpu.LabelPairs(labels(30), labels(20, seed=4))
    calls = []
    real = gpu.pair_histograms
    monkeypatch.setattr(gpu, "pair_histograms", lambda *a: calls.append(a) or real(*a))
    expected = real(q, r, source, OFFSET, SCALE, L)
    hist = dispatch.pair_histograms(q, r, source, OFFSET, SCALE, L, 7, "gpu")
    torch.testing.assert_close(hist, expected, atol=1e-12, rtol=0)
    assert calls[-1][-1] == 7  # chunk_size passed on
    with use_backend("gpu"):
        dispatch.pair_histograms(q, r, source, OFFSET, SCALE, L)
    monkeypatch.setenv(ENV_VAR, "gpu")
    dispatch.pair_histograms(q, r, source, OFFSET, SCALE, L)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="backend must be one of"):
        dispatch.pair_histograms(q, r, source, OFFSET, SCALE, L, backend="cuda")


def test_dispatch_triton_passes_labels_or_dense_categories(monkeypatch):
    """The dispatch side of the triton backend: which arguments reach the kernel (the kernel's
    own correctness is tested with the kernel)."""
    seen = []

    def record(queries, refs, labels, ref_labels, self_columns, offset, scale, L, categories=None):
        seen.append((labels, ref_labels, self_columns, offset, scale, L, categories))
        return queries.new_zeros(len(queries), 2, L + 1)

    monkeypatch.setattr(triton_kernel, "triton_pair_histograms", record)
    q, r = unit(6), unit(4, seed=3)
    lab, ref_lab, own = labels(6), labels(4, seed=4), torch.tensor([0, 1, 2, 3, 0, 1])
    dispatch.pair_histograms(q, r, gpu.LabelPairs(lab, ref_lab, own), 5, -5, L, backend="triton")
    assert seen[-1][0] is lab and seen[-1][1] is ref_lab and seen[-1][2] is own
    assert seen[-1][3:6] == (5.0, -5.0, L) and seen[-1][6] is None
    square = gpu.LabelPairs(lab, lab, diagonal=True)
    dispatch.pair_histograms(q, q, square, OFFSET, SCALE, L, backend="triton")
    assert torch.equal(seen[-1][2], torch.arange(6))
    dense = torch.randint(0, 3, (6, 4), dtype=torch.int8)
    for categories in (dense, chunking.DenseCategories(dense)):
        dispatch.pair_histograms(q, r, categories, OFFSET, SCALE, L, backend="triton")
        assert seen[-1][:3] == (None, None, None) and torch.equal(seen[-1][6], dense)
    with pytest.raises(ValueError, match="refs have"):
        dispatch.pair_histograms(q, unit(4, d=3), dense, OFFSET, SCALE, L, backend="triton")
