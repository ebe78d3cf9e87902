"""Exact multistage backpropagation for losses over batches larger than activation memory.

A listwise loss couples every item of the batch, so plain gradient accumulation over sub-batches
computes a different (wrong) gradient. The exact procedure (FastAP sec. 4.3; Revaud et al. Fig. 2):

1. embed the batch chunk by chunk **without** a graph (memory: one chunk's activations); the
   ``ceil(N / chunk_size)`` chunks are balanced (sizes differ by at most one: 13 items by 4 give
   4, 3, 3, 3), so no tiny last chunk breaks BatchNorm;
2. compute the loss on the full embedding matrix ``E`` (a leaf tensor) and backpropagate it to
   get ``dL/dE`` (and the gradients of any loss parameters, e.g. proxies);
3. re-run each chunk **with** a graph and backpropagate ``dL/dE[chunk]`` into the model,
   accumulating parameter gradients; the caller then takes one optimizer step.

Exactness (what makes step 3 reproduce step 1):

* RNG: the CPU RNG state and, when CUDA is initialized, every GPU's
  (``torch.cuda.get_rng_state_all``) are saved before each chunk in step 1 and restored before
  re-running it, so dropout masks replay; the states after the loss computation are restored at
  the end, so the caller sees the RNGs advanced exactly as by one ordinary step. The masks are
  those of running the model on the same (balanced) chunks: CUDA's Philox generator advances per
  kernel launch, so other chunk sizes draw other masks there (the CPU's stream does not).
* Buffers (BatchNorm running statistics): every buffer of the given modules is snapshotted before
  step 1 and restored after it, so running statistics are updated once per chunk per step (by
  step 3). Batch statistics are those of each chunk, in both passes: chunked BatchNorm equals
  running the model chunk by chunk, not on the whole batch (freeze BatchNorm -- eval mode, e.g.
  PML's ``freeze_trunk_batchnorm`` -- to make the result independent of the chunk size).
* ``check_replay=True`` verifies that step 3 re-creates step 1's embeddings.

Failures are reported where they happen: non-finite embeddings after step 1 (``ValueError``
naming the chunk, its items and the first bad row; buffers restored) and a non-finite ``dL/dE``
after step 2 (naming the row and chunk; nothing is backpropagated into the model) -- some PML
losses return a finite loss on NaN embeddings while their gradients are NaN. A frozen model (no
parameter requiring grad) with a loss that has parameters works: the loss parameters get their
gradients in step 2 and step 3 only replays the chunks (buffer updates).

Distributed (``torch.distributed`` initialized, world size ``R``): each rank embeds its own shard;
embeddings and labels are all-gathered (any shard sizes) so the loss sees the global batch, with
the local rows as the leaf that receives ``dL/dE``. Every rank computes the same loss. Step 3
backpropagates ``R * dL/dE_local``: DDP averages parameter gradients over ranks, so the result is
``sum_r J_r^T dL/dE_r``, exactly the single-process gradient of the global-batch loss. Loss
parameters get the full gradient on every rank directly (the loss is computed in full on each
rank; do not wrap the loss in DDP). DDP-wrapped modules synchronize once per step: all chunks but
the last run under ``no_sync()``.

Memory: O(chunk activations + N d embeddings) instead of O(N activations); time: one extra
forward pass (about +1/3 for a typical network).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from ..functional.validation import check_int
from ..utils.distributed import all_gather_rows
from ._dist import rank, world_size  # noqa: F401  (rank: one definition, re-exported)


def _check_chunk_size(chunk_size) -> int:
    return check_int(chunk_size, "chunk_size", minimum=1)


def balanced_chunk_sizes(n: int, chunk_size: int) -> list[int]:
    """Split ``n`` items into ``ceil(n / chunk_size)`` consecutive chunks of at most
    ``chunk_size`` items whose sizes differ by at most one, larger first (13 by 4: 4, 3, 3, 3).

    Balancing avoids a tiny last chunk: BatchNorm in training mode refuses a chunk of one item
    (where the plain step works), and a small chunk's batch statistics are noisy.
    """
    count = -(-n // chunk_size)
    if count == 0:
        return []
    base, extra = divmod(n, count)
    return [base + 1] * extra + [base] * (count - extra)


def _first_non_finite_row(tensor: torch.Tensor) -> int | None:
    bad = ~torch.isfinite(tensor.reshape(len(tensor), -1)).all(dim=1)
    return int(bad.nonzero()[0]) if bool(bad.any()) else None


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class ChunkedEmbedding:
    """Steps 1 and 3 of the module docstring, split around the caller's loss computation.

    ``forward(inputs, labels)`` returns ``(E, labels)`` for the whole (global) batch, ``E`` ready
    for the loss (its local rows are a leaf that collects ``dL/dE``); after the caller has run
    ``loss.backward()``, ``backward()`` replays the chunks and backpropagates into the model.

    Args:
        embed: maps a chunk of inputs to its embeddings (e.g. ``model`` or trunk + embedder).
        modules: the modules whose buffers must be updated once per step (usually the models).
        chunk_size: most items per chunk (> 0); chunks are balanced (see module docstring).
        check_replay: raise if a replayed chunk's embeddings differ from step 1's.
    """

    def __init__(
        self,
        embed: Callable[[torch.Tensor], torch.Tensor],
        modules: Sequence[torch.nn.Module],
        chunk_size: int,
        check_replay: bool = False,
    ):
        self.embed = embed
        self.modules = list(modules)
        self.chunk_size = _check_chunk_size(chunk_size)
        self.check_replay = check_replay
        self._state = None

    def forward(self, inputs, labels=None):
        if len(inputs) == 0:
            raise ValueError("cannot embed an empty batch")
        sizes = balanced_chunk_sizes(len(inputs), self.chunk_size)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        chunks = [inputs[start : start + size] for start, size in zip(starts, sizes)]
        buffers = [b.detach().clone() for m in self.modules for b in m.buffers()]
        rng_states, outputs = [], []
        with torch.no_grad():
            for i, chunk in enumerate(chunks):
                rng_states.append(_rng_state())
                outputs.append(self.embed(chunk))
                row = _first_non_finite_row(outputs[-1])
                if row is not None:
                    # Restore the buffers before raising: the step did not happen.
                    for buffer, saved in zip(
                        (b for m in self.modules for b in m.buffers()), buffers
                    ):
                        buffer.copy_(saved)
                    raise ValueError(
                        f"chunk {i} (items {starts[i]}-{starts[i] + sizes[i] - 1}) produced "
                        f"non-finite embeddings (first at row {starts[i] + row} of the batch): "
                        "check the inputs and the model (a loss may turn NaN embeddings into a "
                        "finite loss with NaN gradients)"
                    )
        after_pass_one = [b.detach().clone() for m in self.modules for b in m.buffers()]
        for buffer, saved in zip((b for m in self.modules for b in m.buffers()), buffers):
            buffer.copy_(saved)
        local = torch.cat(outputs).requires_grad_(True)
        global_emb, rows = all_gather_rows(local.detach())
        if world_size() > 1:
            global_emb = torch.cat([global_emb[: rows.start], local, global_emb[rows.stop :]])
            if labels is not None:
                labels = all_gather_rows(torch.as_tensor(labels, device=local.device))[0]
        else:
            global_emb = local
        self._state = dict(
            chunks=chunks,
            starts=starts,
            rng=rng_states,
            outputs=outputs,
            local=local,
            after=after_pass_one,
        )
        return global_emb, labels

    def backward(self) -> None:
        if self._state is None:
            raise RuntimeError("backward() needs a forward() first")
        state, self._state = self._state, None
        grad = state["local"].grad
        if grad is None:  # the loss did not depend on the embeddings: keep pass one's buffers
            self._keep_pass_one_buffers(state)
            return
        row = _first_non_finite_row(grad)
        if row is not None:
            chunk = max(i for i, start in enumerate(state["starts"]) if start <= row)
            raise ValueError(
                f"the gradient of the loss with respect to the embeddings is non-finite (first "
                f"at row {row} of the local batch, in chunk {chunk}): the loss function produced "
                "NaN/inf gradients from finite embeddings; nothing was backpropagated into the "
                "model (do not step the optimizer: loss parameters may hold NaN gradients)"
            )
        grad = grad * world_size()
        rng_after_loss = _rng_state()
        offsets = [0]
        for output in state["outputs"]:
            offsets.append(offsets[-1] + len(output))
        last = len(state["chunks"]) - 1
        for i, (chunk, rng) in enumerate(zip(state["chunks"], state["rng"])):
            _set_rng_state(rng)
            with self._no_sync() if i < last else contextlib.nullcontext():
                replayed = self.embed(chunk)
                if self.check_replay and not torch.allclose(
                    replayed.detach(), state["outputs"][i], rtol=1e-5, atol=1e-6
                ):
                    diff = (replayed.detach() - state["outputs"][i]).abs().max().item()
                    raise RuntimeError(
                        f"chunk {i}: replayed embeddings differ from pass one (max |diff| {diff:g});"
                        " the model is not deterministic given its RNG state"
                    )
                if replayed.requires_grad:  # False for a frozen model (nothing to train)
                    replayed.backward(grad[offsets[i] : offsets[i + 1]])
        _set_rng_state(rng_after_loss)

    def _keep_pass_one_buffers(self, state) -> None:
        for buffer, value in zip((b for m in self.modules for b in m.buffers()), state["after"]):
            buffer.copy_(value)

    def _no_sync(self):
        stack = contextlib.ExitStack()
        for module in self.modules:
            if hasattr(module, "no_sync"):
                stack.enter_context(module.no_sync())
        return stack


def chunked_backward(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    loss_fn: Callable,
    chunk_size: int,
    miner: Callable | None = None,
    check_replay: bool = False,
) -> torch.Tensor:
    """One exact large-batch backward pass for any PML loss (and optional miner).

    Embeds ``inputs`` in chunks of ``chunk_size`` without a graph, computes
    ``loss_fn(E, labels, miner(E, labels))`` on the full (all-gathered, under torch.distributed)
    embedding matrix, backpropagates, then replays each chunk and backpropagates its embedding
    gradient into ``model`` (see the module docstring for the exactness guarantees). Parameter
    gradients accumulate in ``.grad`` as after ``loss.backward()`` on the whole batch; the caller
    zeroes gradients and steps the optimizer. Returns the loss (detached).
    """
    stages = ChunkedEmbedding(model, [model], chunk_size, check_replay)
    embeddings, labels = stages.forward(inputs, labels)
    indices_tuple = miner(embeddings, labels) if miner is not None else None
    loss = loss_fn(embeddings, labels, indices_tuple)
    if torch.is_tensor(loss) and loss.requires_grad:
        loss.backward()
    stages.backward()
    return loss.detach() if torch.is_tensor(loss) else torch.as_tensor(loss)
