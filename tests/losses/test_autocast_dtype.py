"""Every loss of this package returns float32 under ``torch.autocast``, like PML's losses, and the
gradient reaching the embeddings keeps their dtype; outside autocast the loss has the embeddings'
dtype (issue 41, item 2). The device type is TEST_DEVICE's, so the same tests run under CUDA."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from tests.conftest import TEST_DEVICE

DEVICE_TYPE = TEST_DEVICE.type
N, D = 24, 8


def _cases() -> dict:
    def mined(emb, labels):
        return RankedListLoss()(emb, labels, RankedListMiner()(emb, labels))

    return {
        "FastAPLoss": lambda e, y: FastAPLoss()(e, y),
        "QuantizedAPLoss": lambda e, y: QuantizedAPLoss()(e, y),
        "QuantizedAPLoss(tie_aware)": lambda e, y: QuantizedAPLoss(tie_aware=True)(e, y),
        "RankedListLoss": lambda e, y: RankedListLoss()(e, y),
        "RankedListLoss(gallery_gradient)": lambda e, y: RankedListLoss(gallery_gradient=True)(
            e, y
        ),
        "RankedListMiner + RankedListLoss": mined,
        "CrossBatchMemory(FastAPLoss)": lambda e, y: CrossBatchMemory(FastAPLoss(), D, 64)(e, y),
        "CrossBatchMemory(RankedListLoss, miner)": lambda e, y: CrossBatchMemory(
            RankedListLoss(), D, 64, miner=RankedListMiner()
        )(e, y),
        "CrossBatchMemory(FastAPLoss), PML's path": lambda e, y: CrossBatchMemory(
            FastAPLoss(), D, 64
        )(e, y, (torch.tensor([0]), torch.tensor([4]), torch.tensor([0]), torch.tensor([1]))),
    }


CASES = _cases()


def _inputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 16, generator=gen).to(TEST_DEVICE)
    labels = (torch.arange(N) % 4).to(TEST_DEVICE)
    linear = torch.nn.Linear(16, D).to(TEST_DEVICE)
    return x, labels, linear


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_float32_under_autocast_gradient_in_embedding_dtype(name, dtype):
    x, labels, linear = _inputs()
    with torch.autocast(DEVICE_TYPE, dtype=dtype):
        emb = linear(x)
        assert emb.dtype == dtype
        loss = CASES[name](emb, labels)
    assert loss.dtype == torch.float32, name
    (grad,) = torch.autograd.grad(loss, emb)
    assert grad.dtype == dtype and torch.isfinite(grad).all() and torch.isfinite(loss)
    assert grad.abs().sum() > 0, name
    # The same float32 value as the loss of the same (rounded) embeddings outside autocast.
    want = CASES[name](emb.detach().float(), labels)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)


def test_pml_fastap_is_float32_under_autocast_too():
    x, labels, linear = _inputs()
    with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
        emb = linear(x)
        assert PMLFastAPLoss()(emb, labels).dtype == FastAPLoss()(emb, labels).dtype
        assert FastAPLoss()(emb, labels).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["FastAPLoss", "RankedListLoss", "CrossBatchMemory(FastAPLoss)"])
def test_outside_autocast_the_loss_has_the_embeddings_dtype(name, dtype):
    x, labels, linear = _inputs()
    emb = linear(x).detach().to(dtype).requires_grad_(True)
    loss = CASES[name](emb, labels)
    assert loss.dtype == dtype
    (grad,) = torch.autograd.grad(loss, emb)
    assert grad.dtype == dtype


@pytest.mark.parametrize("with_indices", [False, True], ids=["self_index path", "PML's path"])
def test_memory_enqueues_low_precision_embeddings_into_a_float32_memory(monkeypatch, with_indices):
    # PML's CrossBatchMemory keeps its float32 memory under autocast, but reads the autocast
    # state with torch.is_autocast_enabled(), which is CUDA's: on the CPU the memory was cast to
    # bf16 and the bug (bf16 rows index-put into the float32 memory) showed on CUDA only. Here
    # that test reads the test device's autocast state, so the CUDA case runs on the CPU too.
    real = torch.is_autocast_enabled
    monkeypatch.setattr(
        torch, "is_autocast_enabled", lambda device_type=DEVICE_TYPE: real(device_type)
    )
    x, labels, linear = _inputs()
    memory = CrossBatchMemory(FastAPLoss(), D, 64)
    pairs = (torch.tensor([0]), torch.tensor([4]), torch.tensor([0]), torch.tensor([1]))
    extra = (tuple(t.to(TEST_DEVICE) for t in pairs),) if with_indices else ()
    with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
        emb = linear(x)
        assert emb.dtype == torch.bfloat16
        loss = memory(emb, labels, *extra)
    assert memory.embedding_memory.dtype == torch.float32 and loss.dtype == torch.float32
    # the queue holds the (rounded) bf16 rows, in float32
    assert torch.equal(memory.embedding_memory[:N], emb.detach().float())
    assert torch.isfinite(loss) and torch.autograd.grad(loss, emb)[0].dtype == torch.bfloat16
