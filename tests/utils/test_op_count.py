"""utils/op_count.py: the operator counter sees forward and backward operators and flags exactly
the operators that make the host wait (on CPU too, so CI can check GPU code paths)."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.utils.op_count import OpCounter, OpTrace, SyncError


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


def _traced(x: torch.Tensor, scale: float = 2.0) -> OpTrace:
    x = x.clone().requires_grad_(True)
    with OpTrace() as trace:
        (x * scale).clamp(0.0, float("nan")).sum().backward()
    return trace


def test_op_trace_records_shapes_and_scalars_never_values():
    first, other_values = _traced(torch.zeros(3, 4)), _traced(torch.randn(3, 4))
    assert first.difference(other_values) is None  # values differ, trace equal (NaN == NaN)
    assert first.total == len(first.trace) and first.trace[0][0] == "aten.mul.Tensor"
    shape = first.difference(_traced(torch.zeros(3, 5)))
    assert shape is not None and "operator 0 differs" in shape and "(3, 5)" in shape
    scalar = first.difference(_traced(torch.zeros(3, 4), scale=3.0))
    assert scalar is not None and "3.0" in scalar  # a Python scalar is baked into a graph too
    dtype = first.difference(_traced(torch.zeros(3, 4, dtype=torch.float64)))
    assert dtype is not None and "float64" in dtype
    strides = first.difference(_traced(torch.zeros(4, 3).T))
    assert strides is not None and "(1, 3)" in strides


def test_op_trace_counts_tensors_made_from_host_data_and_reports_length_differences():
    with OpTrace() as made:
        torch.tensor([1.0, 2.0]) * 2
    with OpTrace() as filled:
        torch.full((2,), 1.0) * 2
    assert made.host_tensors == 1 and filled.host_tensors == 0
    assert made.difference(filled) is not None
    with OpTrace() as longer:
        torch.full((2,), 1.0).mul(2).add(1)
    assert filled.difference(longer) == "2 operators against 3"
    with pytest.raises(SyncError):
        with OpTrace(forbid_syncs=True):
            torch.ones(3).sum().item()
