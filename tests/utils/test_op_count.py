"""utils/op_count.py: the operator counter sees forward and backward operators and flags exactly
the operators that make the host wait (on CPU too, so CI can check GPU code paths)."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.utils.op_count import OpCounter, SyncError


def _x():
    return torch.arange(12.0, device="cpu").view(3, 4).requires_grad_()


@pytest.mark.parametrize(
    "syncing",
    [
        lambda x: x[x > 3],
        lambda x: torch.nonzero(x),
        lambda x: x.sum().item(),
        lambda x: bool((x > 3).any()),
        lambda x: torch.unique(x),
        lambda x: torch.masked_select(x, x > 3),
        lambda x: torch.bincount(x.detach().long().flatten()),
        lambda x: torch.equal(x, x),
        lambda x: torch.repeat_interleave(torch.tensor([1, 2], device="cpu")),
    ],
)
def test_every_syncing_op_is_flagged_and_forbidden(syncing):
    with OpCounter() as ops:
        syncing(_x())
    assert ops.syncs >= 1, dict(ops.counts)
    with pytest.raises(SyncError, match="syncing operator aten"):
        with OpCounter(forbid_syncs=True):
            syncing(_x())


def test_tolist_on_cpu_reads_memory_without_dispatch():
    # On CUDA tolist() copies to the host (aten._to_copy to cpu: flagged, see is_syncing); on the
    # CPU it dispatches nothing, so CPU-side checks cannot see it: code paths use no tolist().
    with OpCounter() as ops:
        _x().detach().tolist()
    assert ops.syncs == 0


def test_masks_and_multiplications_do_not_sync_and_backward_is_counted():
    x = _x()
    with OpCounter(forbid_syncs=True) as ops:
        mask = x > 3
        y = torch.where(mask, x * 2, 0).sum() + (x * mask).sum()
        forward = ops.total
        y.backward()
    assert ops.syncs == 0
    assert forward >= 4 and ops.total > forward  # backward's operators were seen too
    assert ops.counts["where"] >= 1 and ops.counts["mul"] >= 1
    assert torch.equal(x.grad, torch.where(mask, 3.0, 0.0))
