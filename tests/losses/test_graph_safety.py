"""CUDA-graph safety of the losses' ``gpu`` (and, in ``test_histogram_triton.py``'s interpreter
run, ``triton``) paths, proven on the CPU (docs/performance.md, CUDA graphs).

A CUDA graph (``torch.cuda.make_graphed_callables``) records the kernels of one forward +
backward and replays them on new values copied into the same input buffers. A replay computes
the right loss only if the code, given those values, would have launched the same kernels on the
same shapes. The CPU-side evidence, from :class:`~pml_rank_plugins.utils.op_count.OpTrace`:

* after one warm-up call (``make_graphed_callables`` runs three before capturing; caches such as
  the histogram kernel's constant matrices fill there), the aten operator trace of forward +
  backward -- each operator with its arguments' shapes, dtypes, strides and Python scalars, never
  values -- is the same for batches of the same shape whatever the values: labels all distinct
  (no positive anywhere), 4 per class, a random mix with singletons, a single class (no negative
  anywhere); embeddings of another scale, direction and sign;
* no syncing operator (``forbid_syncs=True``: no host read, so no shape or Python value can come
  from the data; a read that dispatches nothing on the CPU, ``tolist()``, is caught by the trace
  comparison instead, as the miner's below) and no tensor made from host data (``torch.tensor``, a host-to-device copy on
  CUDA, refused while capturing);
* the same with a reference set (``ref_emb``, ``ref_labels``) and with several chunks (``chunk_size`` given, or the GPU budget rule
  ``chunking.gpu_budget_bytes`` made small): the chunk plan depends on shapes only.

The checker fails where a call is not graph-safe: the ``cpu`` backend (it syncs, and its shapes
follow the labels), the ``RankedListMiner`` + loss pair (the miner's output size is the number
of mined pairs, read back to the host) and ``CrossBatchMemory`` (each call writes the queue at a host-side position and
ranks a memory whose filled size grows: consecutive calls differ).
"""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import triton_available
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.utils.op_count import SyncError
from tests.graph_safety import D, N, assert_graph_safe, trace_call, value_batches

LOSSES = {
    "FastAP": lambda **kw: FastAPLoss(num_bins=10, **kw),
    "mAP_Q": lambda **kw: QuantizedAPLoss(num_bins=20, **kw),
    "mAP_T": lambda **kw: QuantizedAPLoss(num_bins=20, tie_aware=True, **kw),
    "RankedList": lambda **kw: RankedListLoss(margin=0.4, Tn=10.0, **kw),
    "RankedList gallery_gradient": lambda **kw: RankedListLoss(
        margin=0.4, Tn=10.0, gallery_gradient=True, **kw
    ),
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("chunk_size", [None, 7])  # one chunk; four chunks of 7, 7, 7, 3 rows
def test_gpu_backend_is_graph_safe(name, chunk_size):
    loss = LOSSES[name](backend="gpu", chunk_size=chunk_size)
    trace = assert_graph_safe(loss)
    assert len(trace.trace) > 20 and trace.syncs == 0


@pytest.mark.parametrize("name", ["FastAP", "RankedList"])
def test_gpu_backend_is_graph_safe_with_a_reference_set(name):
    generator = torch.Generator().manual_seed(1)
    refs = torch.randn(2 * N, D, generator=generator)
    ref_labels = torch.randint(0, 6, (2 * N,), generator=generator)
    loss = LOSSES[name](backend="gpu")
    trace = assert_graph_safe(lambda x, labels: loss(x, labels, None, refs, ref_labels))
    assert any(op[1] and op[1][0][1] == (2 * N, D) for op in trace.trace)  # refs were used


def test_gpu_budget_rule_plans_chunks_from_shapes_only(monkeypatch):
    # The chunk plan of the default path (chunk_size=None) comes from the GPU budget rule: made
    # small here, it cuts 24 rows into several chunks, the same for every batch.
    monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device=None: 8 * N * 17)
    for name in ("FastAP", "RankedList"):
        chunked = assert_graph_safe(LOSSES[name](backend="gpu"))
        monkeypatch.undo()
        whole = assert_graph_safe(LOSSES[name](backend="gpu"))
        monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device=None: 8 * N * 17)
        assert len(chunked.trace) > len(whole.trace)  # several chunks: more operators
    plans = {chunking.rows_per_chunk(N, N, None, bytes_per_pair=17) for _ in range(3)}
    assert len(plans) == 1


# -- what is not graph-safe: the checker catches it -------------------------------------------
def test_cpu_backend_is_not_graph_safe():
    with pytest.raises(SyncError, match="syncing operator"):
        assert_graph_safe(FastAPLoss(num_bins=10, backend="cpu"))
    # Without forbidding syncs the trace itself follows the labels: the queries with a positive
    # are selected with nonzero, so the shapes differ between batches.
    loss = FastAPLoss(num_bins=10, backend="cpu")
    (x1, l1), (x2, l2) = value_batches()[1:3]
    trace_call(loss, x1, l1, forbid_syncs=False)
    first = trace_call(loss, x1, l1, forbid_syncs=False)
    assert first.syncs > 0
    assert first.difference(trace_call(loss, x2, l2, forbid_syncs=False)) is not None


def test_miner_is_not_graph_safe_its_output_size_is_read_from_the_data():
    miner = RankedListMiner(margin=0.4, Tn=10.0, backend="gpu")
    loss = RankedListLoss(margin=0.4, Tn=10.0, backend="gpu")

    def mined(x, labels):
        return loss(x, labels, miner(x, labels))

    # The miner reads its pair counts back to the host (``.cpu().tolist()``: on CUDA a
    # device-to-host copy, which OpCounter flags; on the CPU it dispatches nothing) and sizes
    # its output with them, so the traces follow the data; the loss then builds the mined
    # pairs' categories from host constants (torch.tensor).
    with pytest.raises((AssertionError, SyncError), match="host data|differs|against|syncing"):
        assert_graph_safe(mined)
    (x1, l1), (x2, l2) = value_batches()[1:3]
    first = trace_call(mined, x1, l1, forbid_syncs=False)
    second = trace_call(mined, x2, l2, forbid_syncs=False)
    assert first.difference(second) is not None
    sizes = {op[2] for trace in (first, second) for op in trace.trace if "nonzero_static" in op[0]}
    assert len(sizes) > 1  # the mined pairs' count, a shape taken from the data


def test_cross_batch_memory_is_not_graph_safe_consecutive_calls_differ():
    memory = CrossBatchMemory(FastAPLoss(num_bins=10, backend="gpu"), D, memory_size=2 * N)
    x, labels = value_batches()[1]
    traces = [trace_call(memory, x, labels) for _ in range(4)]  # sync-free, but ...
    # ... the filled part of the queue grows (shapes), then the write position moves (scalars):
    # no two consecutive calls have the same trace, even on the same batch once the queue is full.
    for before, after in zip(traces, traces[1:]):
        assert before.difference(after) is not None


# -- on a CUDA GPU: the captured graph replays the eager loss ----------------------------------
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="captures a CUDA graph: needs a CUDA GPU (docs/performance.md, CUDA graphs, runs it)",
)


def _graphed_and_eager(name: str, backend: str, **kwargs):
    if backend == "triton" and not triton_available():
        pytest.skip("triton is not installed (it is optional)")
    batches = [(x.cuda(), labels.cuda()) for x, labels in value_batches()]
    eager = LOSSES[name](backend=backend, **kwargs)
    sample = (batches[1][0].clone().requires_grad_(True), batches[1][1].clone())
    graphed = torch.cuda.make_graphed_callables(LOSSES[name](backend=backend, **kwargs), sample)
    return batches, eager, graphed


def _loss_and_gradient(loss, x, labels):
    x = x.clone().requires_grad_(True)
    value = loss(x, labels)
    value.backward()
    return value.detach(), x.grad


@needs_cuda
@pytest.mark.parametrize("backend", ["gpu", "triton"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_graph_replay_equals_the_eager_loss_on_cuda(name, backend):
    # Captured on the 4-per-class batch, replayed on every class structure of value_batches:
    # the same loss and embedding gradient as the uncaptured loss.
    batches, eager, graphed = _graphed_and_eager(name, backend)
    for x, labels in batches:
        expected, replayed = _loss_and_gradient(eager, x, labels), _loss_and_gradient(
            graphed, x, labels
        )
        torch.testing.assert_close(replayed[0], expected[0])
        torch.testing.assert_close(replayed[1], expected[1])


@needs_cuda
@pytest.mark.parametrize("name", ["FastAP", "RankedList"])
def test_graph_replay_updates_the_device_stats_on_cuda(name):
    # The stats are device tensors made during the capture: a replay rewrites them in place.
    batches, eager, graphed = _graphed_and_eager(name, "gpu", collect_stats=True)
    stat = "num_valid_queries" if name == "FastAP" else "num_pos_pairs"
    for x, labels in batches:
        _loss_and_gradient(eager, x, labels)
        _loss_and_gradient(graphed, x, labels)
        assert int(getattr(graphed, stat)) == int(getattr(eager, stat))
