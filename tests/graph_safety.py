"""The CUDA-graph safety check of ``tests/losses/test_graph_safety.py`` (see its docstring),
shared with the Triton interpreter run of ``tests/functional/histogram/test_histogram_triton.py``:
one warm-up call, then equal operator traces (:class:`~pml_rank_plugins.utils.op_count.OpTrace`)
of forward + backward on batches of one shape with different values, sync-free, with no tensor
made from host data."""

from __future__ import annotations

import torch

from pml_rank_plugins.utils.op_count import OpTrace

N, D = 24, 8


def value_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four ``(embeddings, labels)`` batches of one shape, with different values and class
    structures: all distinct, 4 per class, random with singletons, one class."""
    generator = torch.Generator().manual_seed(0)
    labels = [
        torch.arange(N),
        torch.arange(N) // 4,
        torch.randint(0, 5, (N,), generator=generator),
        torch.zeros(N, dtype=torch.long),
    ]
    scales = [1.0, 3.0, 0.01, -2.0]
    return [
        (scale * torch.randn(N, D, generator=generator), label)
        for scale, label in zip(scales, labels)
    ]


def trace_call(call, embeddings, labels, forbid_syncs: bool = True) -> OpTrace:
    """The trace of ``call(x, labels).backward()`` on a fresh leaf ``x`` holding ``embeddings``."""
    x = embeddings.clone().requires_grad_(True)
    with OpTrace(forbid_syncs=forbid_syncs) as trace:
        call(x, labels).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    return trace


def assert_graph_safe(call, batches: list | None = None) -> OpTrace:
    """Fails unless ``call`` is graph-safe on ``batches`` (see the module docstring): one warm-up
    call, then every batch's trace equal to the first's, sync-free, with no tensor made from
    host data. Returns the first trace."""
    batches = batches or value_batches()
    trace_call(call, *batches[0])  # warm-up: caches fill (make_graphed_callables warms up too)
    first = trace_call(call, *batches[0])
    assert first.host_tensors == 0, "a tensor made from host data after the warm-up"
    for embeddings, labels in batches[1:]:
        other = trace_call(call, embeddings, labels)
        assert other.host_tensors == 0, "a tensor made from host data after the warm-up"
        difference = first.difference(other)
        assert difference is None, difference
    return first
