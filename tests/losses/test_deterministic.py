"""``torch.use_deterministic_algorithms(True)`` works with every loss of ours, the miner and the
memory bank on every backend that runs here (issue 39 item 4): no "does not have a deterministic
implementation" error, and two calls give bit-identical losses and gradients. On CUDA (the
suite's TEST_DEVICE) this is the check that matters: scatter_add_ / index_put_ switch to their
deterministic kernels there (docs/performance.md, Backends)."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.losses import (
    CrossBatchMemory,
    FastAPLoss,
    QuantizedAPLoss,
    RankedListLoss,
)
from pml_rank_plugins.miners import RankedListMiner
from tests.conftest import TEST_DEVICE

LOSSES = {
    "FastAP": lambda b: FastAPLoss(num_bins=10, backend=b),
    "mAP_T": lambda b: QuantizedAPLoss(num_bins=20, tie_aware=True, backend=b),
    "RankedList": lambda b: RankedListLoss(backend=b),
    "RankedList gallery": lambda b: RankedListLoss(gallery_gradient=True, backend=b),
}


def _run(make, backend, miner=False, bank=False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 16, generator=gen).to(TEST_DEVICE).requires_grad_()
    y = torch.randint(0, 6, (40,), generator=gen).to(TEST_DEVICE)
    loss_func = make(backend)
    if bank:
        loss_func = CrossBatchMemory(loss_func, embedding_size=16, memory_size=64)
        loss_func(x.detach()[:20] * 0.5, y[:20])
    pairs = RankedListMiner(backend=backend)(x, y) if miner else None
    loss = loss_func(x, y) if pairs is None else loss_func(x, y, pairs)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("case", ["plain", "miner", "bank"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_deterministic_mode_runs_and_repeats_bit_for_bit(name, case, backend):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        kwargs = {"miner": case == "miner", "bank": case == "bank"}
        first = _run(LOSSES[name], backend, **kwargs)
        again = _run(LOSSES[name], backend, **kwargs)
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.isfinite(first[0]) and first[1].abs().sum() > 0
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
