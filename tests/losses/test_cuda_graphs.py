"""CUDA graphs: ``torch.compile(step, mode="reduce-overhead")`` of a model + loss step, with each
loss on the ``gpu`` and ``triton`` backends, equals the eager step over several replays, and the
state the losses keep between calls stays right (issue 48, item 4; see docs/compile.md).

What a replay can get wrong, and what is checked after every one of :data:`STEPS` steps (each
with new inputs of the same shapes, as in training):

* the loss value and the model's gradient (the backward graph is captured too);
* ``loss.num_valid_queries`` / ``num_skipped_queries``: on the sync-free path 0-dim tensors
  assigned as attributes *inside* the compiled region. Dynamo turns the assignment into a graph
  output and replays the ``setattr`` after the graph, so under CUDA graphs the attribute is a
  tensor in the graph's static memory pool: right after its own step, overwritten by the next
  replay. A reference kept across steps must be read (``int()``) or cloned before the next step;
  :func:`test_a_kept_reference_is_never_silently_another_steps_value` checks that a stale one
  is either still its own step's value or raises (torch's "overwritten by a subsequent run"),
  never silently the next step's;
* ``CrossBatchMemory``'s queue (``embedding_memory``, ``label_memory`` written in place, and the
  Python ``queue_idx`` / ``has_been_filled``): after each step equal to the eager module's, the
  wrap-around included (:data:`STEPS` batches overfill the memory of :data:`MEMORY` rows).

The CUDA cases (``mode="reduce-overhead"``, inductor) need a GPU and are skipped without one (the
GPU kit runs them: ``tests/losses`` is one of its device directories). The same steps run on the
CPU with ``backend="aot_eager"`` (Dynamo and AOT autograd, no CUDA graphs) as their analogue for
RankedList, FastAP and the memory bank: everything above but the static memory pool.
"""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss

CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(
    not CUDA, reason="CUDA graphs need a CUDA GPU (torch.cuda.is_available() is False)"
)
N, IN, D, CLASSES = 16, 8, 16, 4  # a batch of 4 classes x 4
# A memory of 2 batches fills at step 1 and wraps at step 2: every state of the queue, and few
# graphs (Dynamo guards on queue_idx and has_been_filled: one graph per state; see the docs).
MEMORY = 2 * N
STEPS = 4


def make_loss(name: str, backend: str) -> torch.nn.Module:
    if name == "fastap":
        return FastAPLoss(backend=backend)
    if name == "quantized_ap":
        return QuantizedAPLoss(backend=backend)
    if name == "ranked_list":
        return RankedListLoss(backend=backend)
    inner = FastAPLoss(backend=backend) if name == "xbm_fastap" else RankedListLoss(backend=backend)
    return CrossBatchMemory(inner, D, memory_size=MEMORY)


LOSSES = ["fastap", "quantized_ap", "ranked_list", "xbm_fastap", "xbm_ranked_list"]
CUDA_GRAPHS = {"mode": "reduce-overhead"}  # inductor with CUDA graph trees
AOT = {"backend": "aot_eager"}  # the CPU analogue: Dynamo + AOT autograd, no CUDA graphs
# The CPU analogue of the losses' two state kinds, at its compile cost (2 cores, under load):
# RankedList (1-10 s), FastAP's tensor num_valid_queries (3-16 s), the memory bank's queue
# (6-22 s, slow: a graph per queue state). Every loss's compiled value and gradient on the
# CPU is the compile matrix's (issue 48, item 2).
CPU_CASES = [
    pytest.param("ranked_list", "cpu", "gpu", AOT, id="ranked_list-cpu-gpu-aot_eager"),
    pytest.param("fastap", "cpu", "gpu", AOT, id="fastap-cpu-gpu-aot_eager"),
    pytest.param(
        "xbm_ranked_list",
        "cpu",
        "gpu",
        AOT,
        marks=pytest.mark.slow,
        id="xbm_ranked_list-cpu-gpu-aot_eager",
    ),
]
# (loss, device, backend of the loss, torch.compile keywords)
CASES = [
    pytest.param(name, "cuda", backend, CUDA_GRAPHS, marks=cuda_only, id=f"{name}-cuda-{backend}")
    for name in LOSSES
    for backend in ("gpu", "triton")
] + CPU_CASES


def batch(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs (new values, same shapes every step) and labels (shuffled)."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(N, IN, generator=gen)
    labels = torch.arange(CLASSES).repeat_interleave(N // CLASSES)
    return x.to(device), labels[torch.randperm(N, generator=gen)].to(device)


def state(loss: torch.nn.Module) -> dict:
    """What the loss keeps between calls, copied (a CUDA-graph output is overwritten later)."""
    out = {}
    inner = loss.loss if isinstance(loss, CrossBatchMemory) else loss
    for key in ("num_valid_queries", "num_skipped_queries"):
        value = getattr(inner, key)
        out[key] = int(value)  # a tensor (sync-free path) or an int
    if isinstance(loss, CrossBatchMemory):
        out["queue_idx"], out["has_been_filled"] = int(loss.queue_idx), bool(loss.has_been_filled)
        out["embedding_memory"] = loss.embedding_memory.detach().clone()
        out["label_memory"] = loss.label_memory.detach().clone()
    return out


def train_steps(name: str, device: str, backend: str, compile_kwargs: dict | None) -> list[dict]:
    """:data:`STEPS` steps of a ``Linear`` model + the loss (``compile_kwargs``: compiled with
    them; ``None``: eager); after each, the loss, the weight gradient and the loss's state."""
    torch.manual_seed(0)
    model = torch.nn.Linear(IN, D).to(device)
    loss_fn = make_loss(name, backend).to(device)

    def step(x, labels):
        return loss_fn(model(x), labels)

    if compile_kwargs is not None:
        step = torch.compile(step, **compile_kwargs)
    rows = []
    for k in range(STEPS):
        x, labels = batch(k, device)
        model.zero_grad(set_to_none=True)
        if compile_kwargs is not None and device == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # a new training step: a new generation
        value = step(x, labels)
        value.backward()
        rows.append(
            {"loss": value.detach().clone(), "grad": model.weight.grad.clone(), **state(loss_fn)}
        )
    return rows


@pytest.mark.parametrize("name, device, backend, compile_kwargs", CASES)
def test_a_compiled_step_equals_eager_over_several_replays(name, device, backend, compile_kwargs):
    torch._dynamo.reset()
    eager = train_steps(name, device, backend, None)
    compiled = train_steps(name, device, backend, compile_kwargs)
    for k, (want, got) in enumerate(zip(eager, compiled)):
        assert got.keys() == want.keys()
        for key in want:
            where = f"step {k}: {key}"
            if isinstance(want[key], torch.Tensor):
                torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=where)
            else:
                assert got[key] == want[key], where
    if name.startswith("xbm"):  # the queue wrapped around: every slot written, some twice
        assert [r["queue_idx"] for r in eager] == [16, 0, 16, 0]
        assert [r["has_been_filled"] for r in eager] == [False, True, True, True]


@cuda_only
@pytest.mark.parametrize("backend", ["gpu", "triton"])
def test_a_kept_reference_is_never_silently_another_steps_value(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(IN, D).cuda()
    loss_fn = FastAPLoss(backend=backend)

    @torch.compile(mode="reduce-overhead")
    def step(x, labels):
        return loss_fn(model(x), labels)

    kept, values = [], []
    for k in range(STEPS):
        x, labels = batch(k, "cuda")
        torch.compiler.cudagraph_mark_step_begin()
        step(x, labels).backward()
        kept.append(loss_fn.num_valid_queries)  # no clone: what a careless logger keeps
        values.append(int(loss_fn.num_valid_queries))
    x, labels = batch(0, "cuda")
    labels[:CLASSES] = torch.arange(CLASSES, 2 * CLASSES, device="cuda")  # 4 singletons: no AP
    torch.compiler.cudagraph_mark_step_begin()
    step(x, labels).backward()
    assert int(loss_fn.num_valid_queries) == N - CLASSES  # the new step's own value
    for k, tensor in enumerate(kept):  # each from an earlier replay of the same graph
        try:
            seen = int(tensor)
        except RuntimeError as e:  # torch refuses to read an overwritten CUDA-graph output
            assert "overwritten by a subsequent run" in str(e)
        else:
            assert seen == values[k], f"step {k}'s kept num_valid_queries changed to {seen}"
