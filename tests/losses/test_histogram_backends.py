"""The histogram-AP losses on the gpu backend (run here on the CPU): the same values and
gradients as the cpu backend (float64) in every case the losses take, selected by keyword,
context or PML_RANK_BACKEND, with no syncing operator and within the aten-operator budget."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.miners import MultiSimilarityMiner
from pytorch_metric_learning.reducers import SumReducer

from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import ENV_VAR, use_backend
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss
from pml_rank_plugins.utils.op_count import OpCounter

from ..conftest import make_embeddings_and_labels

LOSSES = {
    "fastap": lambda **kw: FastAPLoss(num_bins=10, **kw),
    "ap_q": lambda **kw: QuantizedAPLoss(num_bins=12, **kw),
    "ap_t": lambda **kw: QuantizedAPLoss(num_bins=12, tie_aware=True, **kw),
    "ap_q_balanced": lambda **kw: QuantizedAPLoss(num_bins=12, class_balanced=True, **kw),
}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def value_and_grads(loss_fn, inputs, *args, **kwargs):
    loss = loss_fn(*args, **kwargs)
    return loss.detach(), torch.autograd.grad(loss, inputs)


def assert_same(loss_name, call, inputs, **loss_kwargs):
    """``call(loss_fn)`` on the cpu and the gpu backend: equal values and gradients."""
    cpu_fn = LOSSES[loss_name](backend="cpu", **loss_kwargs)
    gpu_fn = LOSSES[loss_name](backend="gpu", **loss_kwargs)
    cpu_value, cpu_grads = call(cpu_fn)
    gpu_value, gpu_grads = call(gpu_fn)
    torch.testing.assert_close(gpu_value, cpu_value, atol=1e-12, rtol=1e-12)
    for ours, expected in zip(gpu_grads, cpu_grads):
        torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-10)
    assert int(gpu_fn.num_valid_queries) == cpu_fn.num_valid_queries
    assert int(gpu_fn.num_skipped_queries) == cpu_fn.num_skipped_queries
    return gpu_fn


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_gpu_equals_cpu_on_a_batch(name, chunk_size):
    x, y = make_embeddings_and_labels(n=24, dim=6, num_classes=5)
    y[0] = 99  # a query without a positive: skipped
    gpu_fn = assert_same(
        name, lambda f: value_and_grads(f, (x,), x, y), (x,), chunk_size=chunk_size
    )
    assert isinstance(gpu_fn.num_valid_queries, torch.Tensor)  # 0-dim: no sync to count
    assert gpu_fn.num_valid_queries.ndim == 0 and int(gpu_fn.num_skipped_queries) == 1


@pytest.mark.parametrize("name", ["fastap", "ap_t"])
def test_gpu_equals_cpu_with_a_patched_budget(name, monkeypatch):
    x, y = make_embeddings_and_labels(n=30, dim=6, num_classes=4)
    # float64 pairs take 25 bytes: 6 rows of 30 columns per chunk, 5 chunks.
    monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: 25 * 30 * 6)
    assert_same(name, lambda f: value_and_grads(f, (x,), x, y), (x,))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gpu_equals_cpu_with_miner_pairs(name):
    x, y = make_embeddings_and_labels(n=20, dim=6, num_classes=4)
    pairs = MultiSimilarityMiner(epsilon=0.3)(x.detach(), y)
    assert_same(name, lambda f: value_and_grads(f, (x,), x, y, pairs), (x,))
    triplets = (torch.tensor([0, 1, 2]), torch.tensor([4, 5, 6]), torch.tensor([1, 2, 3]))
    assert_same(name, lambda f: value_and_grads(f, (x,), x, y, triplets), (x,))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gpu_equals_cpu_with_ref_emb_and_self_index(name):
    x, y = make_embeddings_and_labels(n=12, dim=6, num_classes=3, seed=1)
    ref, ref_y = make_embeddings_and_labels(n=18, dim=6, num_classes=3, seed=2)
    assert_same(name, lambda f: value_and_grads(f, (x, ref), x, y, None, ref, ref_y), (x, ref))
    slots = torch.arange(12) + 3
    memory = ref.detach().clone()
    memory[slots] = x.detach()
    memory_y = ref_y.clone()
    memory_y[slots] = y
    memory.requires_grad_()
    assert_same(
        name,
        lambda f: value_and_grads(f, (x, memory), x, y, None, memory, memory_y, self_index=slots),
        (x, memory),
    )


@pytest.mark.parametrize("name", ["fastap", "ap_q_balanced"])
def test_gpu_equals_cpu_in_a_memory_bank(name):
    results = {}
    for backend in ("cpu", "gpu"):
        bank = CrossBatchMemory(LOSSES[name](backend=backend), 6, memory_size=20)
        steps = []
        for step in range(4):  # fills, wraps around, full
            x, y = make_embeddings_and_labels(n=8, dim=6, num_classes=3, seed=step)
            steps.append(value_and_grads(bank, (x,), x, y))
        results[backend] = steps
    for (value, grad), (expected, expected_grad) in zip(results["gpu"], results["cpu"]):
        torch.testing.assert_close(value, expected, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(grad[0], expected_grad[0], atol=1e-12, rtol=1e-10)


def test_other_reducers_get_the_valid_queries_elements():
    x, y = make_embeddings_and_labels(n=16, dim=6, num_classes=4)
    y[3] = 50
    assert_same("ap_q", lambda f: value_and_grads(f, (x,), x, y), (x,), reducer=SumReducer())


def test_keyword_context_and_variable_select_the_gpu_path(monkeypatch):
    x, y = make_embeddings_and_labels(n=16, dim=6, num_classes=4)
    loss_fn = FastAPLoss()
    loss_fn(x, y)
    # auto: the cpu path (Python int stats) on the CPU, the gpu path (device tensors) elsewhere
    auto_type = int if x.device.type == "cpu" else torch.Tensor
    assert isinstance(loss_fn.num_valid_queries, auto_type)
    with use_backend("gpu"):
        loss_fn(x, y)
    assert isinstance(loss_fn.num_valid_queries, torch.Tensor)
    monkeypatch.setenv(ENV_VAR, "gpu")
    loss_fn(x, y)
    assert isinstance(loss_fn.num_valid_queries, torch.Tensor)
    FastAPLoss(backend="cpu")(x, y)  # the keyword beats the variable
    keyword = FastAPLoss(backend="cpu")
    keyword(x, y)
    assert isinstance(keyword.num_valid_queries, int)
    monkeypatch.delenv(ENV_VAR)
    keyword = QuantizedAPLoss(backend="gpu")
    keyword(x, y)
    assert isinstance(keyword.num_valid_queries, torch.Tensor)


def test_bad_backend_and_check_values_are_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        FastAPLoss(backend="cuda")
    with pytest.raises(ValueError, match="check_values must be None, True or False"):
        QuantizedAPLoss(check_values=1)


def test_value_checks_are_opt_in_on_the_gpu_path():
    x, y = make_embeddings_and_labels(n=8, dim=4, num_classes=2, requires_grad=False)
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        FastAPLoss(backend="cpu")(x, y)
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        FastAPLoss(backend="gpu", check_values=True)(x, y)
    # No value read back: the NaN reaches the loss, which the trainer checks once per step.
    assert torch.isnan(FastAPLoss(backend="gpu")(x, y))
    assert torch.isnan(QuantizedAPLoss(backend="gpu")(x * float("inf"), y))
    good, _ = make_embeddings_and_labels(n=8, dim=4, num_classes=2)
    bad_pairs = (torch.tensor([0]), torch.tensor([9]), torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"indices_tuple\[1\] \(positives\) has index 9"):
        FastAPLoss(backend="gpu", check_values=True)(good, y, bad_pairs)
    memory, memory_y = make_embeddings_and_labels(n=10, dim=4, num_classes=2, seed=3)
    wrong = torch.zeros(8, dtype=torch.long)  # slot 0 does not hold every query
    with pytest.raises(ValueError, match="is not query"):
        FastAPLoss(backend="gpu", check_values=True)(
            good, y, None, memory, memory_y, self_index=wrong
        )


@pytest.mark.parametrize(
    "embeddings, message",
    [
        (torch.zeros(8), r"embeddings must be 2-D \(N, D\)"),
        (torch.zeros(8, 4, dtype=torch.int64), "embeddings must be a floating-point tensor"),
    ],
)
def test_bad_shapes_and_dtypes_are_named_on_the_gpu_path(embeddings, message):
    with pytest.raises(ValueError, match=message):
        FastAPLoss(backend="gpu")(embeddings, torch.zeros(8, dtype=torch.long))
    x, y = make_embeddings_and_labels(n=8, dim=4, num_classes=2)
    with pytest.raises(ValueError, match="ref_emb must be 2-D"):
        FastAPLoss(backend="gpu")(x, y, None, torch.zeros(5, 3), torch.zeros(5))


def test_empty_batch_and_single_class_give_a_connected_zero():
    for x, y in (
        (torch.zeros(0, 4, requires_grad=True), torch.zeros(0, dtype=torch.long)),
        (torch.randn(6, 4, requires_grad=True), torch.zeros(6, dtype=torch.long)),
    ):
        loss = FastAPLoss(backend="gpu")(x, y)
        assert loss.item() == 0
        (grad,) = torch.autograd.grad(loss, x)
        assert grad.eq(0).all()


def test_autocast_computes_in_float32():
    x, y = make_embeddings_and_labels(n=16, dim=6, num_classes=4, dtype=torch.float32)
    expected = FastAPLoss(backend="gpu")(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = FastAPLoss(backend="gpu")(x, y)
    torch.testing.assert_close(under.float(), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "name, make, budget",
    [
        ("fastap", lambda: FastAPLoss(backend="gpu"), 100),
        ("ap_q", lambda: QuantizedAPLoss(backend="gpu"), 100),
        ("ap_t", lambda: QuantizedAPLoss(tie_aware=True, backend="gpu"), 100),
        (
            "memory_bank",
            lambda: CrossBatchMemory(FastAPLoss(backend="gpu"), 16, memory_size=512),
            120,
        ),
    ],
)
def test_no_sync_and_the_operator_budget(name, make, budget):
    """The CPU proxy of issue 39: forward + backward at one chunk, no syncing operator, at most
    100 dispatched aten operators for FastAP / mAP_Q (mAP_T too). The count does not depend on
    N within one chunk (every operator covers the whole chunk), so it is taken at N = 256, where
    the 2 GiB budget also gives one chunk (N = 4096 does as well: 17 bytes x 4096^2 < 2 GiB)."""
    assert chunking.rows_per_chunk(4096, 4096, bytes_per_pair=17) == 4096
    loss_fn = make()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=gen, requires_grad=True)
    y = torch.arange(256) // 4
    loss_fn(x, y).backward()  # first call: cached constants
    if name == "memory_bank":
        loss_fn(x, y).backward()  # the bank full: its steady state
    with OpCounter(forbid_syncs=True) as ops:
        loss_fn(x, y).backward()
    assert ops.syncs == 0
    assert ops.total <= budget, sorted(ops.counts.items(), key=lambda kv: -kv[1])
