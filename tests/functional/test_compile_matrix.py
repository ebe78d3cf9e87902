"""``torch.compile`` equals eager: every loss x backend x compile backend, value and gradient.

Issue 48: compiled FastAP / RankedList on the ``cpu`` backend returned silently wrong losses
(40 x 32 embeddings, 10 classes x 4: FastAP 0.902765 eager, 0.914212 under ``aot_eager``;
RankedList 0.710675 -> 1.827091). The cause: ``LabelCategories`` wrote IGNORED (2) into a bool
buffer through an int8 view; functionalization (``aot_eager``, ``inductor``) writes that update
back into the buffer as a bool copy, which stores 2 as True (1): the self pairs became negatives.
Every cell below compares a compiled call with an eager
call of a separate, identically built loss, in value and in the gradient of the embeddings
(float32, rtol 1e-5), at one chunk (40 rows, the default chunking) and at three chunks
(``chunk_size=16``, on two torch threads on the ``cpu`` backend, so the chunk threads run).
The expected values are the eager calls: the compiled path has no other reference.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import MultiSimilarityLoss
from torch._dynamo.testing import CompileCounterWithBackend

from pml_rank_plugins.functional.euclidean import euclidean_distances
from pml_rank_plugins.functional.histogram.ap_losses import masked_ap_losses
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.samplers import RandomClassSampler

N, D, CLASSES = 40, 32, 10
CHUNKS = {"one_chunk": None, "three_chunks": 16}
BACKENDS = ("cpu", "gpu")
# float32 compiled vs eager: the same operations (aot_eager) agree to the bit or to rounding;
# inductor fuses elementwise passes, which may round differently in the last bits.
RTOL, ATOL = 1e-5, 1e-7


class MinedLoss(torch.nn.Module):
    """``loss(emb, labels, miner(emb, labels))``: a miner and a loss as one compiled call."""

    def __init__(self, loss: torch.nn.Module, miner: torch.nn.Module):
        super().__init__()
        self.loss, self.miner = loss, miner

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels, self.miner(embeddings, labels))


def _loss(name: str, backend: str, chunk: int | None) -> torch.nn.Module:
    """A fresh loss module of the matrix: ``name`` on ``backend`` with ``chunk_size=chunk``."""
    kw = {"backend": backend, "chunk_size": chunk}
    miner = RankedListMiner(**kw)
    losses = {
        "fastap": lambda: FastAPLoss(**kw),
        "map_q": lambda: QuantizedAPLoss(**kw),
        "map_t": lambda: QuantizedAPLoss(tie_aware=True, **kw),
        "rll": lambda: RankedListLoss(**kw),
        "rll_weight_share": lambda: RankedListLoss(query_weighting="weight_share", **kw),
        "rll_miner": lambda: MinedLoss(RankedListLoss(**kw), miner),
        "pml_multi_similarity_miner": lambda: MinedLoss(MultiSimilarityLoss(), miner),
    }
    return losses[name]()


def _memory(name: str, backend: str, chunk: int | None) -> CrossBatchMemory:
    kw = {"backend": backend, "chunk_size": chunk}
    loss = FastAPLoss(**kw) if name == "fastap" else RankedListLoss(**kw)
    # 64 slots for batches of 24: the third call wraps around the queue.
    return CrossBatchMemory(loss, embedding_size=D, memory_size=64)


def _inputs(seed: int = 0, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(n, D, generator=gen)
    labels = torch.arange(CLASSES).repeat_interleave(N // CLASSES)[:n]
    return embeddings, labels[torch.randperm(n, generator=gen)]


def _value_and_grad(fn, embeddings, labels) -> tuple[torch.Tensor, torch.Tensor]:
    x = embeddings.clone().requires_grad_(True)
    loss = fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


@pytest.fixture
def threads(request):
    """Two torch threads for the several-chunks cells (the ``cpu`` backend then runs its chunks
    on two Python threads), one otherwise; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2 if request.node.callspec.params.get("chunk") == "three_chunks" else 1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(before)


def _compiled(module, compiler: str):
    """``torch.compile(module, backend=compiler)`` that fails its first call if nothing was
    compiled (every frame skipped or broken: compiled == eager would then be vacuous)."""
    counter = CompileCounterWithBackend(compiler)
    compiled = torch.compile(module, backend=counter)

    def call(*args):
        out = compiled(*args)
        assert counter.frame_count > 0, "torch.compile compiled no graph"
        return out

    return call


def _check(name, backend, chunk, compiler):
    embeddings, labels = _inputs()
    expected = _value_and_grad(_loss(name, backend, CHUNKS[chunk]), embeddings, labels)
    compiled = _compiled(_loss(name, backend, CHUNKS[chunk]), compiler)
    actual = _value_and_grad(compiled, embeddings, labels)
    # Not a vacuous comparison: a positive loss with a gradient.
    assert expected[0] > 0 and expected[1].abs().max() > 0
    torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)


LOSSES = (
    "fastap",
    "map_q",
    "map_t",
    "rll",
    "rll_weight_share",
    "rll_miner",
    "pml_multi_similarity_miner",
)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LOSSES)
def test_aot_eager_equals_eager(name, backend, chunk, threads):
    _check(name, backend, chunk, "aot_eager")


# Inductor generates and compiles C++ for every graph (a dozen for FastAP on the cpu backend,
# between its graph breaks). Measured cold (empty inductor cache) on the 2-core machine: FastAP
# 24 s (cpu) / 16-19 s (gpu) when idle, up to 100 s / 56 s next to other jobs; RankedList 6-9 s.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("chunk", ["three_chunks"])
@pytest.mark.parametrize(
    "name, backend",
    [
        pytest.param("fastap", "cpu", marks=_SLOW),
        pytest.param("fastap", "gpu", marks=_SLOW),
        ("rll", "cpu"),
        ("rll", "gpu"),
    ],
)
def test_inductor_equals_eager(name, backend, chunk, threads):
    _check(name, backend, chunk, "inductor")


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(
    "name, backend",
    [
        ("fastap", "cpu"),
        ("fastap", "gpu"),
        ("rll", "cpu"),
        ("rll", "gpu"),
    ],
)
def test_cross_batch_memory_aot_eager_equals_eager_over_calls(name, backend, chunk, threads):
    eager = _memory(name, backend, CHUNKS[chunk])
    memory = _memory(name, backend, CHUNKS[chunk])
    compiled = _compiled(memory, "aot_eager")
    for call in range(3):
        embeddings, labels = _inputs(seed=call, n=24)
        expected = _value_and_grad(eager, embeddings, labels)
        actual = _value_and_grad(compiled, embeddings, labels)
        assert expected[0] > 0 and expected[1].abs().max() > 0
        torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)
    # The queue the compiled calls kept is the eager one.
    assert memory.queue_idx == eager.queue_idx and memory.has_been_filled == eager.has_been_filled
    torch.testing.assert_close(memory.embedding_memory, eager.embedding_memory, rtol=0, atol=0)
    torch.testing.assert_close(memory.label_memory, eager.label_memory, rtol=0, atol=0)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_miner_aot_eager_equals_eager(backend, chunk, threads):
    # The mined pairs and weights themselves (the losses above see them only through a loss).
    embeddings, labels = _inputs()
    kw = {"backend": backend, "chunk_size": CHUNKS[chunk]}
    expected = RankedListMiner(**kw)(embeddings, labels)
    actual = _compiled(RankedListMiner(**kw), "aot_eager")(embeddings, labels)
    assert len(expected[0]) > 0 and len(expected[2]) > 0
    for got, want in zip(actual, expected):
        assert torch.equal(got, want)
    torch.testing.assert_close(actual.weights, expected.weights, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mean_over", [None, 5.0])
@pytest.mark.parametrize("tie_aware", [False, True])
def test_masked_ap_losses_aot_eager_equals_eager(tie_aware, mean_over):
    # The autograd.Function the gpu path traces (the cpu path too, after its kernel): an empty
    # bin (H = 0) and an unranked query included.
    gen = torch.Generator().manual_seed(1)
    hist = torch.rand(6, 2, 5, generator=gen)
    hist[:, :, 0] = 0
    num_pos = hist[:, 0].sum(1).round()
    ranked = torch.tensor([True, True, False, True, True, True])
    weights = torch.rand(6, generator=gen)
    count = None if mean_over is None else torch.tensor(mean_over)

    def fn(h: torch.Tensor, _labels) -> torch.Tensor:
        return masked_ap_losses(h, num_pos, ranked, tie_aware, weights, count).sum()

    torch._dynamo.reset()
    expected = _value_and_grad(fn, hist, None)
    actual = _value_and_grad(_compiled(fn, "aot_eager"), hist, None)
    torch._dynamo.reset()
    assert expected[1].abs().max() > 0
    torch.testing.assert_close(actual[0], expected[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(actual[1], expected[1], rtol=RTOL, atol=ATOL)


def test_euclidean_distances_aot_eager_equals_eager():
    # Both gradients, and the zero-distance convention (gradient 0 at d = 0: a repeated row).
    x, _ = _inputs(n=8)
    y = torch.cat([x[:3], torch.randn(5, D, generator=torch.Generator().manual_seed(2))])
    upstream = torch.rand(8, 8, generator=torch.Generator().manual_seed(3))

    def grads(fn):
        a, b = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        d = fn(a, b)
        return (d.detach(), *torch.autograd.grad((d * upstream).sum(), (a, b)))

    torch._dynamo.reset()
    expected = grads(euclidean_distances)
    actual = grads(_compiled(euclidean_distances, "aot_eager"))
    torch._dynamo.reset()
    assert (expected[0].diagonal()[:3] == 0).all()
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def _train(backend: str, compiler: str | None) -> list[torch.Tensor]:
    """Three SGD steps of a linear embedder with ``RankedListMiner`` + ``RankedListLoss`` plus
    ``FastAPLoss`` on batches from ``RandomClassSampler``; ``compiler``: the compile backend of
    the step's forward (model, miner and losses), ``None`` for eager. Returns the parameters."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(80, 16, generator=gen)
    labels = torch.arange(CLASSES).repeat_interleave(8)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, D)
    miner, loss_fn = RankedListMiner(backend=backend), RankedListLoss(backend=backend)
    fastap = FastAPLoss(backend=backend)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        embeddings = model(x)
        return loss_fn(embeddings, y, miner(embeddings, y)) + fastap(embeddings, y)

    run = step if compiler is None else _compiled(step, compiler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = RandomClassSampler(labels, batch_size=20, samples_per_class=4, seed=0)
    for _, batch in zip(range(3), sampler):
        optimizer.zero_grad()
        loss = run(features[batch], labels[batch])
        assert loss > 0
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_training_step_equals_eager_over_three_steps(backend):
    torch._dynamo.reset()
    expected = _train(backend, None)
    actual = _train(backend, "aot_eager")
    torch._dynamo.reset()
    # The steps moved the parameters (lr 0.5): the comparison is not of the initial values.
    torch.manual_seed(0)
    initial = torch.nn.Linear(16, D)
    assert (expected[0] - initial.weight.detach()).abs().max() > 1e-3
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-6)
