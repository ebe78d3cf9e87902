"""``torch.compile(..., fullgraph=True)`` of every loss on the sync-free ``gpu`` backend (run here
on the CPU, with ``backend="aot_eager"``): one graph, no graph break, and the compiled loss equals
the eager one in value and embedding gradient (float32).

What used to break the graph on ``gpu`` (issue 48), each fixed where it was:

* self-ranking passed one tensor as both ``queries`` and ``refs`` of an ``autograd.Function``
  (``GpuPairHistogram``, ``_GpuRankedList`` with ``gallery_gradient=True``): "duplicate tensor
  input"; the references are now ``None`` for the batch itself;
* ``RankedListLoss``'s gpu path entered ``one_torch_thread`` (``torch.get_num_threads``: "torch.*
  op returned non-Tensor"); skipped while compiling;
* a tensor cached on the ``LabelPairs`` source inside the traced histogram function (memory
  banks' ``self_index``) and the columns kept as a ``ctx`` attribute; a data-pointer comparison
  of the queries and a memory bank (``_same_rows``).

:class:`~pml_rank_plugins.miners.RankedListMiner` reads its tuples' lengths back once per call
(``.tolist()``): with ``fullgraph=True`` dynamo captures them as data-dependent sizes, so a miner
+ loss step is one graph too (the read still happens when it runs: not CUDA-graph capturable); a
default compile breaks the graph there, and only there. Two edits made that possible: the
miner's gpu path skips ``one_torch_thread`` while compiling, and ``validate_indices_tuple``
compares data-dependent lengths without reading them. What still breaks, by design: a value
check (``check_values=True`` reads values back; tested at the end).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from pml_rank_plugins.functional.backend import ENV_VAR, use_backend
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

from ..conftest import make_embeddings_and_labels

N, DIM, CLASSES = 24, 8, 6
# Query rows per chunk: one chunk, or four (the multi-chunk forward and recomputing backward).
CHUNKS = {"one_chunk": None, "four_chunks": 6}


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mined(embeddings, labels):
    """A ``RankedListMiner``'s weighted pairs (mined eagerly, outside the compiled region)."""
    return RankedListMiner(backend="gpu")(embeddings.detach(), labels)


def _reference_batch(embeddings, labels):
    gen = torch.Generator().manual_seed(5)
    ref = torch.randn(10, DIM, generator=gen, dtype=embeddings.dtype).to(embeddings.device)
    return ref, torch.arange(10, device=labels.device) % CLASSES


LOSSES = {
    "fastap": (lambda **kw: FastAPLoss(num_bins=10, **kw), None),
    "fastap_mined_pairs": (lambda **kw: FastAPLoss(num_bins=10, **kw), "mined"),
    "map_q_class_balanced": (lambda **kw: QuantizedAPLoss(class_balanced=True, **kw), None),
    "map_t": (lambda **kw: QuantizedAPLoss(num_bins=12, tie_aware=True, **kw), None),
    "ranked_list": (lambda **kw: RankedListLoss(**kw), None),
    "ranked_list_weight_share": (
        lambda **kw: RankedListLoss(query_weighting="weight_share", Tp=1.0, **kw),
        None,
    ),
    "ranked_list_gallery_gradient": (
        lambda **kw: RankedListLoss(gallery_gradient=True, **kw),
        None,
    ),
    "ranked_list_ref_emb": (lambda **kw: RankedListLoss(**kw), "ref"),
    "ranked_list_miner_weights": (lambda **kw: RankedListLoss(**kw), "mined"),
    "ranked_list_with_miner": (lambda **kw: RankedListLoss(**kw), "miner"),
    "fastap_with_miner": (lambda **kw: FastAPLoss(num_bins=10, **kw), "miner"),
}


def _extra_inputs(inputs, embeddings, labels) -> tuple[tuple, dict]:
    """The loss call's other arguments, made eagerly (the miner outside the compiled region)."""
    if inputs == "ref":
        ref, ref_labels = _reference_batch(embeddings, labels)
        return (), dict(ref_emb=ref, ref_labels=ref_labels)
    if inputs == "mined":
        return (_mined(embeddings, labels),), {}
    return (), {}


def _value_and_grad(fn, embeddings, labels):
    x = embeddings.detach().clone().requires_grad_()
    value = fn(x, labels)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


def _assert_fullgraph_equals_eager(eager, embeddings, labels):
    """``eager`` compiled with ``fullgraph=True`` (a graph break raises) into exactly one graph,
    equal to ``eager`` in value and gradient, without dynamo's ``lru_cache`` warning; the
    gradient is not all zero (the test would be empty otherwise)."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(eager, fullgraph=True, backend=counter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad = _value_and_grad(compiled, embeddings, labels)
    assert counter.frame_count == 1 and counter.op_count > 10
    # The kernels' constant tables are lru_cached in eager only: dynamo warns of a cache it
    # traces past ("Silent incorrectness is only a potential risk"), which a user cannot act on.
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    expected_value, expected_grad = _value_and_grad(eager, embeddings, labels)
    torch.testing.assert_close(value, expected_value, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert float(grad.abs().max()) > 0


# Several chunks (the multi-chunk forward and the recomputing backward) for one loss of each
# kernel, the self-ranking gradient of the Ranked List kernel included; the rest at one chunk
# (compiling costs about a second a case).
CASES = [(name, "one_chunk") for name in LOSSES] + [
    (name, "four_chunks")
    for name in ("fastap", "ranked_list_gallery_gradient", "ranked_list_with_miner")
]


@pytest.mark.parametrize("name, chunks", CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_loss_compiles_fullgraph_on_gpu_backend(name, chunks):
    make, inputs = LOSSES[name]
    loss = make(backend="gpu", chunk_size=CHUNKS[chunks])
    embeddings, labels = make_embeddings_and_labels(N, DIM, CLASSES, torch.float32, seed=1)
    if inputs == "miner":  # mined inside the compiled step, chunked as the loss
        miner = RankedListMiner(backend="gpu", chunk_size=CHUNKS[chunks])
        _assert_fullgraph_equals_eager(
            lambda x, y: loss(x, y, miner(x, y)), embeddings.detach(), labels
        )
        return
    args, kwargs = _extra_inputs(inputs, embeddings, labels)
    _assert_fullgraph_equals_eager(
        lambda x, y: loss(x, y, *args, **kwargs), embeddings.detach(), labels
    )


def test_use_backend_context_compiles_fullgraph():
    """The backend from ``use_backend`` (no keyword) is read while tracing; the compiled call
    equals eager under the same context (the Ranked List loss: its gpu path is where the thread
    context used to break the graph)."""
    loss = RankedListLoss()
    embeddings, labels = make_embeddings_and_labels(N, DIM, CLASSES, torch.float32, seed=2)
    with use_backend("gpu"):
        _assert_fullgraph_equals_eager(lambda x, y: loss(x, y), embeddings.detach(), labels)


def test_cross_batch_memory_compiles_fullgraph_and_keeps_its_queue():
    """The memory bank's self-index path (queue update, the memory as references, the batch's
    slots left out), a FastAP bank and a Ranked List bank with a ``RankedListMiner`` in one graph
    per call: over
    three steps, filling the queue, the compiled banks equal eager twins in loss, gradient and
    memory contents. (The queue position and ``has_been_filled`` are Python values dynamo
    specializes on: one graph per state, here 3; past ``torch._dynamo.config.recompile_limit``
    states, 8, ``fullgraph=True`` fails with ``FailOnRecompileLimitHit``.)"""

    def banks():
        return (
            CrossBatchMemory(FastAPLoss(backend="gpu"), embedding_size=DIM, memory_size=30),
            CrossBatchMemory(
                RankedListLoss(backend="gpu"),
                embedding_size=DIM,
                memory_size=30,
                miner=RankedListMiner(backend="gpu"),
            ),
        )

    compiled_banks, eager_banks = banks(), banks()

    def step(bank_pair):
        return lambda x, y: bank_pair[0](x, y) + 0.5 * bank_pair[1](x, y)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step(compiled_banks), fullgraph=True, backend=counter)
    for seed in range(3):
        embeddings, labels = make_embeddings_and_labels(10, DIM, 5, torch.float32, seed=seed)
        value, grad = _value_and_grad(compiled, embeddings, labels)
        expected_value, expected_grad = _value_and_grad(step(eager_banks), embeddings, labels)
        torch.testing.assert_close(value, expected_value, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
        for ours, twin in zip(compiled_banks, eager_banks):
            assert ours.queue_idx == twin.queue_idx
            assert torch.equal(ours.embedding_memory, twin.embedding_memory)
    assert float(grad.abs().max()) > 0 and compiled_banks[0].queue_idx == 0
    assert counter.frame_count == 3  # queue positions 0, 10, 20, not yet filled


def test_smaller_last_batch_compiles_fullgraph():
    """A smaller last batch recompiles (dynamo's automatic dynamic shapes), without a graph
    break, equal to eager."""
    loss = FastAPLoss(num_bins=10, backend="gpu")
    compiled = torch.compile(lambda x, y: loss(x, y), fullgraph=True, backend="aot_eager")
    for n in (24, 18):
        embeddings, labels = make_embeddings_and_labels(n, DIM, CLASSES, torch.float32, seed=n)
        value, grad = _value_and_grad(compiled, embeddings.detach(), labels)
        expected = _value_and_grad(lambda x, y: loss(x, y), embeddings, labels)
        torch.testing.assert_close((value, grad), expected, rtol=1e-5, atol=1e-7)


# ---- What does not compile without a graph break, and must say so (fullgraph raises). ----


@pytest.mark.parametrize(
    "make",
    [
        lambda: FastAPLoss(backend="gpu", check_values=True),
        lambda: RankedListLoss(backend="gpu", check_values=True),
    ],
    ids=["fastap", "ranked_list"],
)
def test_value_checks_are_a_graph_break(make):
    """``check_values=True`` reads values back on the host (finite embeddings): a graph break,
    which ``fullgraph=True`` reports instead of tracing past it."""
    loss = make()
    embeddings, labels = make_embeddings_and_labels(N, DIM, CLASSES, torch.float32)
    compiled = torch.compile(lambda x, y: loss(x, y), fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(embeddings.detach(), labels)


def test_ranked_list_miner_breaks_a_default_compile_only_at_its_pair_counts():
    """The miner's tuples have data-dependent lengths, read back once per call (``host_counts``,
    ``.tolist()``). With ``fullgraph=True`` dynamo captures that read as unbacked sizes (one
    graph, tested above); a default compile instead breaks the graph there, and only there:
    every break dynamo reports is that data-dependent operator (at each frame it returns
    through), none the thread context's (its gpu path skips ``one_torch_thread`` while
    compiling)."""
    miner, loss = RankedListMiner(backend="gpu"), RankedListLoss(backend="gpu")
    embeddings, labels = make_embeddings_and_labels(N, DIM, CLASSES, torch.float32)
    explained = torch._dynamo.explain(lambda x, y: loss(x, y, miner(x, y)))(embeddings, labels)
    reasons = [reason.reason for reason in explained.break_reasons]
    assert reasons and all(reason.startswith("Data dependent operator") for reason in reasons)
