"""Coarse-grained parallelism across the chunks of a chunked kernel (CPU).

The chunked kernels (:mod:`~pml_rank_plugins.functional.histogram.cpu`,
:mod:`~pml_rank_plugins.functional.ranked_list.cpu`) run a dozen elementwise operations and a
product on each chunk of query rows. Run one after the other with torch's intra-op threads, every
operation is a parallel region that ends in a barrier: with ``T`` threads and one core taken by
another process, each barrier waits for the thread whose core is busy, up to a scheduler time
slice. At N = 4096 (32 chunks, about 500 regions per forward + backward), measured on a 2-core
machine: about 20x the floor next to a one-thread training process or a niced loop that starts
short processes, while the three large products of the floor slow down by about 2.3x.

:func:`map_chunks` instead gives each of ``T`` Python threads whole chunks, each chunk run with
one torch thread (torch releases the GIL inside its operations). Chunks are claimed one at a time,
so a thread whose core is busy simply takes fewer of them, and the only barrier is the join at
the end. The results are those of the sequential loop: every chunk computes the same operations
on the same rows (with one thread instead of ``T``, which can change the last bits of a
reduction), and each chunk writes only its own rows; cross-chunk sums are left to the caller, in
chunk order, so the result does not depend on which thread ran which chunk.

The glue. What runs around the chunk loops (normalization, the AP of the histograms, sums
over ``(N, d)`` tensors), forward and backward, runs on one torch thread
(:func:`one_torch_thread`, :func:`one_thread_apply`): with the caller's ``T`` threads each of
its few dozen operations is a parallel region that waits on a busy core too, which left the
histogram losses at up to 1.77x the floor in single runs next to a training process. The chunks
keep the caller's ``T`` threads (:func:`chunk_workers` reads the count from before).

Thread state. ``torch.set_num_threads`` has no per-thread form: the helper threads' call also
sets torch's process-wide default to 1 for the duration of :func:`map_chunks`, and
:func:`one_torch_thread` for its block, i.e. while a loss's forward or a kernel's backward runs
(restored on return, also on error). Threads that already ran torch keep their own count; a
thread whose *first* torch operation falls inside that window starts with one thread. Grad mode and
inference mode, which are thread-local, are passed to the helpers; autocast is not (the kernels
run with autocast disabled or only use ops it leaves alone).

Under ``torch.compile``. The ``cpu`` kernels' entry points
(:func:`~pml_rank_plugins.functional.histogram.cpu.pair_histograms`,
:func:`~pml_rank_plugins.functional.ranked_list.cpu.chunked_ranked_list_terms`,
:func:`~pml_rank_plugins.functional.ranked_list.cpu.chunked_ranked_list_mining`) are
``torch.compiler.disable``: a graph break, the kernel run eagerly, exactly as without compiling.
Their chunk loops are host programs -- a thread pool sized from ``torch.get_num_threads()``,
``torch.set_num_threads``, buffers reused in place through aliasing views, a sparse or dense path
chosen per chunk from a count read back, Python objects kept on ``ctx`` for the backward -- that a
trace would specialize to one thread count and one data-dependent branch, or cut at graph breaks
inside an ``autograd.Function``; nothing is traced there, so nothing can be traced wrongly
(``tests/functional/test_compile_matrix.py``). While compiling, :func:`one_torch_thread` and
:func:`one_thread_apply` are plain calls: the traced glue runs later as graphs, outside any
Python block that could set its thread count (the glue then runs on the caller's threads).

Measured (``benchmarks/bench_histogram_ap.py`` and ``bench_ranked_list.py`` with ``--load``, see
``docs/performance.md``): at N = 4096 next to a one-thread training process, FastAP went from
19.8x to 0.85-1.37x the floor and RankedList from 11.9x to 0.41-0.82x; next to a niced
process-launching loop from 21.9x / 18.3x to 0.79x / 0.78x. With the glue on one thread too, five
runs next to the training process: FastAP 0.71-0.76x, mAP_Q 0.75-0.78x, RankedList 0.42-0.43x.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch

Result = TypeVar("Result")

# The caller's torch thread count while one_torch_thread runs (per Python thread).
_caller = threading.local()

#: Glue whose largest tensor has more elements than this keeps the caller's threads: one
#: elementwise pass over 4M float32 elements takes a few ms on one thread, so beyond this the
#: threads' speed-up on an idle machine outweighs a barrier's wait on a busy one (e.g. the
#: normalization of a 65,536 x 128 memory bank, or (N, M) pair masks from an indices_tuple).
GLUE_MAX_ELEMENTS = 1 << 22


def glue_elements(queries: torch.Tensor, refs: torch.Tensor, dense_pairs: bool = False) -> int:
    """Size of the largest tensor the glue around a kernel of ``queries`` ``(N, d)`` against
    ``refs`` ``(M, d)`` touches: ``max(N, M) d``, or ``N M`` when the pairs are dense ``(N, M)``
    masks (an ``indices_tuple``)."""
    # Any shape: malformed inputs are reported by the checks inside the block.
    n, m = (x.shape[0] if x.ndim else 1 for x in (queries, refs))
    width = queries.shape[1] if queries.ndim > 1 else 1
    return max(max(n, m) * width, n * m if dense_pairs else 0)


def chunk_workers(count: int, device: torch.device) -> int:
    """How many threads :func:`map_chunks` uses for ``count`` chunks on ``device``: the caller's
    torch intra-op thread count on CPU (inside :func:`one_torch_thread`: the count from before
    it), at most ``count``; else 1 (GPU kernels are asynchronous)."""
    if device.type != "cpu":
        return 1
    threads = getattr(_caller, "threads", None) or torch.get_num_threads()
    return max(1, min(count, threads))


@contextmanager
def one_torch_thread(device: torch.device, elements: int) -> Iterator[None]:
    """Runs the block with one torch intra-op thread (CPU; a no-op on other devices, when
    already inside, and when ``elements``, the size of the block's largest tensor (see
    :func:`glue_elements`), exceeds :data:`GLUE_MAX_ELEMENTS`).

    The glue around the chunk loops (normalization, the AP of the histograms, index and sum
    operations on ``(N, d)`` or ``(N, L)`` tensors) is a few dozen small operations, each a
    parallel region when it has more than 32K elements. With ``T`` threads and a core taken by
    another process each region waits for the thread whose core is busy (about 15-30 ms each,
    measured: ``normalize_rows`` of 4096 x 128 took 17-32 ms forward and 10-57 ms backward next
    to a one-thread training process, 0.3-1.9 ms with one thread). On one thread they cost
    microseconds more when the machine is idle. :func:`chunk_workers` inside still returns the
    caller's count, so the chunks keep their threads. Restores the count on exit, also on error;
    like :func:`map_chunks`, it sets torch's process-wide default while it runs.
    """
    inside = getattr(_caller, "threads", None) is not None
    # While torch.compile traces (the body becomes graphs that run later, outside any Python
    # block), a thread count set here would not surround the graph's operations: a no-op then.
    tracing = torch.compiler.is_compiling()
    if device.type != "cpu" or inside or elements > GLUE_MAX_ELEMENTS or tracing:
        yield
        return
    threads = torch.get_num_threads()
    _caller.threads = threads
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        _caller.threads = None
        if threads != 1:
            torch.set_num_threads(threads)


class _OneThread(torch.autograd.Function):
    """``fn(*inputs)`` run under :func:`one_torch_thread`, forward and backward; the backward
    recomputes ``fn`` with autograd (same operations, so the same gradient as calling ``fn``
    directly) and differentiates it. For cheap glue only: ``fn`` runs twice. Under
    ``create_graph=True`` the recomputation is on the original inputs, so the gradient is itself
    differentiable (double backward as for the plain call)."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        with one_torch_thread(inputs[0].device, 0):
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        device = inputs[0].device
        create_graph = torch.is_grad_enabled()
        with one_torch_thread(device, 0), torch.enable_grad():
            with torch.autocast(device.type, enabled=False):
                if create_graph:
                    leaves = list(inputs)
                else:
                    leaves = [x.detach().requires_grad_(need) for x, need in zip(inputs, needs)]
                out = ctx.fn(*leaves)
            wanted = [leaf for leaf, need in zip(leaves, needs) if need]
            grads = iter(
                torch.autograd.grad(out, wanted, grad, allow_unused=True, create_graph=create_graph)
            )
        return (None, *(next(grads) if need else None for need in needs))


def one_thread_apply(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(*inputs)`` (one tensor out), forward and backward on one torch thread (see
    :func:`one_torch_thread`): for the glue before and after a chunked kernel, whose backward
    the autograd engine would otherwise run with the caller's thread count. ``fn`` must be
    deterministic and cheap (the backward recomputes it); its constants go in a closure.
    Without gradient it runs on one thread, no recomputation; on devices other than the CPU
    and for inputs over :data:`GLUE_MAX_ELEMENTS` it is a plain call.

    Cost: ``fn`` twice (forward, and again in the backward), and the backward holds the
    recomputation's intermediates (a few tensors of ``fn``'s input size) while it runs. The
    first such backward in a process adds about 35 MiB of resident memory once (measured: the
    first ``torch.autograd.grad`` called inside a backward, PyTorch 2.14, CPU), not per call."""
    if inputs[0].device.type != "cpu" or max(x.numel() for x in inputs) > GLUE_MAX_ELEMENTS:
        return fn(*inputs)
    if torch.compiler.is_compiling():
        # Traced, ``fn``'s operations become part of the graph (autograd included), which the
        # thread count of a Python block cannot surround; _OneThread's backward (a Python
        # callable recomputed under torch.autograd.grad) is not traceable either.
        return fn(*inputs)
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs):
        with one_torch_thread(inputs[0].device, 0):
            return fn(*inputs)
    return _OneThread.apply(fn, *inputs)


def map_chunks(work: Callable[[int, int], Result], count: int, workers: int) -> list[Result]:
    """``[work(index, worker) for index in range(count)]``, the chunks spread over threads.

    ``worker`` (``0 <= worker < workers``) names the thread running the call, so ``work`` can use
    per-thread buffers. With one worker every call runs in this thread with torch's threads
    unchanged. With several, this thread and ``workers - 1`` helper threads claim
    indices in increasing order, each running with one torch thread and this thread's grad and
    inference mode;
    torch's thread count is restored on return. ``work`` must write only data of its own chunk
    (or of its worker).

    Args:
        work: ``work(index, worker)`` processes chunk ``index``.
        count: number of chunks.
        workers: number of threads, usually :func:`chunk_workers` ``(count, device)``.

    Returns:
        The results in index order.

    Raises:
        Whatever ``work`` raised first; the other threads stop claiming chunks.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or count < 2:
        return [work(index, 0) for index in range(count)]
    results: list = [None] * count
    claim = threading.Lock()
    state = {"next": 0, "failed": False}
    grad_enabled = torch.is_grad_enabled()
    inference = torch.is_inference_mode_enabled()
    threads = torch.get_num_threads()

    def run(worker: int) -> None:
        # Grad and inference mode are thread-local: without the caller's inference mode, an
        # in-place update of a buffer created under it fails. The thread count of a fresh thread
        # comes from the global setting, which is set to 1 until this call returns.
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad_enabled):
            while True:
                with claim:
                    index = state["next"]
                    if index >= count or state["failed"]:
                        return
                    state["next"] = index + 1
                try:
                    results[index] = work(index, worker)
                except BaseException:
                    state["failed"] = True
                    raise

    try:
        with ThreadPoolExecutor(max_workers=workers - 1) as pool:
            helpers = [pool.submit(run, worker) for worker in range(1, workers)]
            try:
                run(0)
            finally:
                # Collect every helper before re-raising, so none outlives the call.
                errors = [helper.exception() for helper in helpers]
        for error in errors:
            if error is not None:
                raise error
    finally:
        torch.set_num_threads(threads)
    return results


class ExclusiveRows:
    """A category source's ``rows(start, stop)`` made safe for :func:`map_chunks`.

    ``LabelCategories`` computes rows into a buffer it reuses from call to call; here each worker
    passes its own buffer as ``out``, so no two workers ever share one (no lock, no copy).
    ``DenseCategories`` returns views of its tensor and ignores ``out``. With one worker the
    source's own buffer is used.
    """

    def __init__(self, source, workers: int):
        self.source = source
        self.shape = tuple(source.shape)
        self.workers = workers
        self._buffers: list[torch.Tensor | None] = [None] * workers

    def rows(self, start: int, stop: int, worker: int = 0) -> torch.Tensor:
        """Rows ``[start, stop)`` of the categories, owned by ``worker`` until its next call."""
        if self.workers == 1:
            return self.source.rows(start, stop)
        buffer = self._buffers[worker]
        if buffer is None or len(buffer) < stop - start:
            buffer = self._buffers[worker] = torch.empty(
                stop - start, self.shape[1], dtype=torch.int8, device=self.source.device
            )
        return self.source.rows(start, stop, out=buffer)
