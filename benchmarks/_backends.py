"""Per-backend measurement pieces of the benchmarks (issue 39): no table code here (that is
``_backend_report.py``), nothing imported from ``_measure.py`` (which imports this module).

* case names -- ``"ours@gpu"`` is the case ``"ours"`` run under
  ``pml_rank_plugins.functional.backend.use_backend("gpu")`` for its whole forward + backward
  (:func:`split_case`, :func:`backend_context`); a case without ``@`` runs as before (``auto``);
  ``"ours@gpu+graph"`` (``--cuda-graph``) is that case captured once as a CUDA graph and replayed
  (:func:`split_graph`, :func:`graphed_step`; "skipped: needs CUDA" elsewhere);
* settings that reach every case, in this process or in a ``--child`` subprocess, through the
  environment (:func:`apply_settings`, :func:`settings`): ``--time-guard`` (a case whose single
  call takes longer is skipped), ``--budget-s`` (cases that start after the deadline are skipped)
  and whether kernels / operators are counted;
* :class:`CaseSkipped` -- raised inside a case, recorded as ``{"skipped": reason}``;
* :func:`count_cuda` -- CUDA kernels launched, host synchronisations and device-to-host copies of
  one call (``torch.profiler``), and the synchronisations ``torch.cuda.set_sync_debug_mode``
  reports; :func:`count_ops` -- the CPU proxy (``pml_rank_plugins.utils.op_count.OpCounter``);
* :func:`pml_bytes` / :func:`memory_limit_bytes` -- PML's predicted O(L N^2) / O(N^2) memory and
  what the device has, to skip PML where it would run out of memory.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pml_rank_plugins.functional.backend import use_backend
from pml_rank_plugins.utils.op_count import OpCounter

SEPARATOR = "@"
GRAPH_SUFFIX = "+graph"  # "gpu+graph": the gpu backend's call captured in a CUDA graph
NEEDS_CUDA = "needs CUDA (torch.cuda.make_graphed_callables)"
BACKEND_CHOICES = ("cpu", "gpu", "triton", "auto")
GUARD_ENV = "PML_BENCH_TIME_GUARD_S"
DEADLINE_ENV = "PML_BENCH_DEADLINE"  # time.time() after which no case starts
COUNT_ENV = "PML_BENCH_COUNT"  # "1": count kernels (CUDA) or aten operators (CPU) per call
# Timed calls on CUDA stop once they add up to about this many seconds (at least MIN_REPEATS).
REPEAT_BUDGET_S = 1.5
MIN_REPEATS = 3
# CUDA runtime calls that block the host until the device has finished (profiler CPU events).
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",  # the synchronous copy (cudaMemcpyAsync + a stream sync is counted once)
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)


class CaseSkipped(Exception):
    """A case not measured on purpose (time guard, time budget, memory prediction): the message
    is the reason printed in the table's notes and kept in the JSON."""


# -- lists on the command line ------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    """``"256,1024"`` -> ``[256, 1024]`` (argparse ``type``; with ``nargs="+"`` the lists of
    ``--sizes 256,1024 4096`` are joined by :func:`flatten`)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"expected integers separated by commas, got {text!r}") from None


def flatten(values: Iterable) -> list:
    """One flat list from items and lists of items (``--sizes 256,1024 4096``)."""
    flat = []
    for value in values:
        flat.extend(value if isinstance(value, list) else [value])
    return flat


def backend_list(text: str) -> list[str]:
    """``--backends cpu,gpu,triton``: the names, each checked against :data:`BACKEND_CHOICES`."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    bad = [name for name in names if name not in BACKEND_CHOICES]
    if bad or not names:
        raise ValueError(
            f"--backends takes names from {', '.join(BACKEND_CHOICES)} separated by commas; "
            f"got {text!r}"
        )
    return list(dict.fromkeys(names))


def add_backend_flags(parser, cuda_graph: bool = False) -> None:
    """``--backends``, ``--time-guard``, ``--budget-s``, ``--cpu-backend-max`` and, with
    ``cuda_graph``, ``--cuda-graph``."""
    parser.add_argument(
        "--backends",
        type=backend_list,
        default=None,
        help="measure our losses under each of these backends (cpu,gpu,triton,auto), one row "
        "each beside PML and the floor, with kernel / operator counts; without it the "
        "original table (default backend)",
    )
    parser.add_argument(
        "--time-guard",
        type=float,
        default=None,
        metavar="S",
        help="skip a case whose single call takes more than S seconds (a first call over S, as "
        "a Triton compile, gets one more try)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="S",
        help="skip the cases that would start more than S seconds after the script started",
    )
    parser.add_argument(
        "--cpu-backend-max",
        type=int,
        default=None,
        metavar="N",
        help="with --backends: measure the cpu backend only up to this N",
    )
    if cuda_graph:
        parser.add_argument(
            "--cuda-graph",
            action="store_true",
            help="with --backends: also each backend but cpu captured in a CUDA graph "
            "(torch.cuda.make_graphed_callables; rows gpu+graph, triton+graph), measured beside "
            "its ungraphed row; skipped with 'needs CUDA' on the CPU",
        )


def apply_settings(args) -> None:
    """Puts the per-case settings of ``args`` where every case reads them (the environment, so a
    ``--child`` subprocess inherits them): the guard, the deadline and counting (on with
    ``--backends``)."""
    for name in (GUARD_ENV, DEADLINE_ENV, COUNT_ENV):
        os.environ.pop(name, None)
    if getattr(args, "time_guard", None):
        os.environ[GUARD_ENV] = repr(float(args.time_guard))
    if getattr(args, "budget_s", None):
        os.environ[DEADLINE_ENV] = repr(time.time() + float(args.budget_s))
    if getattr(args, "backends", None):
        os.environ[COUNT_ENV] = "1"


def settings() -> dict:
    """``{"guard_s": float | None, "deadline": float | None, "count": bool}`` for this case."""
    guard, deadline = os.environ.get(GUARD_ENV), os.environ.get(DEADLINE_ENV)
    return {
        "guard_s": float(guard) if guard else None,
        "deadline": float(deadline) if deadline else None,
        "count": os.environ.get(COUNT_ENV) == "1",
    }


def check_deadline() -> None:
    """Raises :class:`CaseSkipped` when ``--budget-s`` has run out."""
    deadline = settings()["deadline"]
    if deadline is not None and time.time() > deadline:
        raise CaseSkipped("out of the time budget (--budget-s)")


# -- backends -------------------------------------------------------------------------------------
def split_case(case: str) -> tuple[str, str | None]:
    """``"ours@gpu"`` -> ``("ours", "gpu")``; ``"ours"`` -> ``("ours", None)``."""
    base, _, backend = case.partition(SEPARATOR)
    return base, backend or None


def split_graph(backend: str | None) -> tuple[str | None, bool]:
    """``"gpu+graph"`` -> ``("gpu", True)``; ``"gpu"`` -> ``("gpu", False)``."""
    if backend is not None and backend.endswith(GRAPH_SUFFIX):
        return backend[: -len(GRAPH_SUFFIX)], True
    return backend, False


def backend_variants(backends: list[str], cuda_graph: bool) -> list[str]:
    """The backend column's entries in table order: each backend, followed with ``cuda_graph``
    by its graphed twin (``"gpu+graph"``), except ``cpu`` (it syncs and sizes tensors from the
    labels: not capturable, docs/performance.md, CUDA graphs)."""
    variants = []
    for backend in backends:
        variants.append(backend)
        if cuda_graph and backend != "cpu":
            variants.append(backend + GRAPH_SUFFIX)
    return variants


def graphed_step(
    loss_fn: Callable, x: torch.Tensor, labels: torch.Tensor, autocast: str = "none"
) -> Callable[[], torch.Tensor]:
    """``lambda: loss_fn(x, labels)`` through ``torch.cuda.make_graphed_callables``: the first
    call captures the loss (three warm-up calls on a side stream, then one forward and one
    backward graph; inside the timed case's peak-memory window and first-call time), every call
    copies ``x`` and ``labels`` into the graph's static inputs (as a training step with fresh
    embeddings would) and replays: forward here, backward on ``.backward()``. ``autocast``
    (``"bfloat16"`` ...): the forward runs under ``torch.autocast`` with its weight cache off,
    as ``make_graphed_callables`` requires."""
    dtype = None if autocast == "none" else getattr(torch, autocast)

    def forward(embeddings: torch.Tensor, batch_labels: torch.Tensor) -> torch.Tensor:
        if dtype is None:
            return loss_fn(embeddings, batch_labels)
        with torch.autocast(embeddings.device.type, dtype=dtype, cache_enabled=False):
            return loss_fn(embeddings, batch_labels)

    graphed = []

    def step() -> torch.Tensor:
        if not graphed:
            sample = (x.detach().clone().requires_grad_(x.requires_grad), labels.clone())
            graphed.append(torch.cuda.make_graphed_callables(forward, sample))
        return graphed[0](x, labels)

    return step


def backend_context(backend: str | None) -> contextlib.AbstractContextManager:
    """``use_backend(backend)`` (``None``: nothing, the default rule)."""
    return contextlib.nullcontext() if backend is None else use_backend(backend)


# -- one call, timed ------------------------------------------------------------------------------
def call_seconds(step: Callable[[], object], cuda: bool) -> float:
    """Wall time of one ``step()`` (on CUDA until the device has finished)."""
    start = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def guarded_first_calls(step: Callable[[], object], cuda: bool, guard_s: float | None) -> list:
    """With a guard: one timed call, and a second one when the first took over ``guard_s`` (a
    compile or autotune happens once); :class:`CaseSkipped` when that one does too. Returns the
    times of the calls made (they count as warm-up); ``[]`` without a guard."""
    if guard_s is None:
        return []
    first = call_seconds(step, cuda)
    if first <= guard_s:
        return [first]
    second = call_seconds(step, cuda)
    if second > guard_s:
        raise CaseSkipped(
            f"one call took {second:.1f} s (first {first:.1f} s), over --time-guard {guard_s:g} s"
        )
    return [first, second]


def adaptive_repeats(repeats: int, call_s: float | None) -> int:
    """``repeats``, cut so that the timed calls add up to about :data:`REPEAT_BUDGET_S` (never
    under :data:`MIN_REPEATS`, never over ``repeats``)."""
    if call_s is None or call_s <= 0:
        return repeats
    return min(repeats, max(MIN_REPEATS, math.ceil(REPEAT_BUDGET_S / call_s)))


# -- counting -------------------------------------------------------------------------------------
def count_ops(step: Callable[[], object]) -> dict:
    """The CPU proxy of one call: ``{"aten_ops", "sync_ops", "sync_op_names"}`` from
    :class:`~pml_rank_plugins.utils.op_count.OpCounter` (dispatched aten operators, syncing
    ones)."""
    with OpCounter() as ops:
        step()
    return {"aten_ops": ops.total, "sync_ops": ops.syncs, "sync_op_names": dict(ops.sync_counts)}


MARKER = "pml_bench_call"


def classify_profile(events: Iterable) -> dict:
    """Counts in the profiler events of one call marked ``record_function(MARKER)``: ``kernels``
    (device events that are neither a ``Memcpy``, a ``Memset`` nor the marker's own annotation),
    ``syncs`` (CPU-side runtime calls in :data:`SYNC_CALLS` that start inside the marked range, so
    the profiler's own synchronisation at its exit is left out), ``dtoh`` (device-to-host
    ``Memcpy DtoH`` events) and ``copies`` (all device copies).

    Each event needs ``.name``, ``.device_type`` (``torch.autograd.DeviceType``) and
    ``.time_range`` (``.start``, ``.end``); without a marker event every sync call counts."""
    events = list(events)
    cuda = torch.autograd.DeviceType.CUDA
    marks = [e for e in events if e.name == MARKER and e.device_type != cuda]
    span = (marks[0].time_range.start, marks[0].time_range.end) if marks else None
    kernels = syncs = dtoh = copies = 0
    sync_names: dict[str, int] = {}
    for event in events:
        name = event.name
        if event.device_type == cuda:
            if name.startswith("Memcpy"):
                copies += 1
                dtoh += "DtoH" in name
            elif not name.startswith("Memset") and name != MARKER:
                kernels += 1
        elif name in SYNC_CALLS:
            if span is not None and not span[0] <= event.time_range.start <= span[1]:
                continue
            syncs += 1
            sync_names[name] = sync_names.get(name, 0) + 1
    return {
        "kernels": kernels,
        "syncs": syncs,
        "dtoh": dtoh,
        "copies": copies,
        "sync_calls": sync_names,
    }


def count_cuda(step: Callable[[], object]) -> dict:
    """Kernels, host syncs and device-to-host copies of one ``step()`` on CUDA
    (:func:`classify_profile` of a ``torch.profiler`` trace, CPU + CUDA activities), and
    ``sync_warnings``: the synchronising calls ``torch.cuda.set_sync_debug_mode("warn")``
    reported in a second call (a check on the profiler's count). A profiler failure is recorded
    as ``{"count_error": ...}``, not raised."""
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(MARKER):
                step()
        counts = classify_profile(prof.events())
    except Exception as e:  # noqa: BLE001 -- counts are extra, the timing stands
        counts = {"count_error": f"{type(e).__name__}: {e}"}
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    counts["sync_warnings"] = sum("synchroniz" in str(w.message) for w in caught)
    return counts


def count_call(step: Callable[[], object], cuda: bool) -> dict:
    """:func:`count_cuda` on CUDA, :func:`count_ops` elsewhere."""
    return count_cuda(step) if cuda else count_ops(step)


# -- memory of PML's losses -----------------------------------------------------------------------
# Bytes per (query, reference) pair that PML's losses hold at their peak, forward + backward,
# float32: FastAPLoss keeps about 4 (L + 1) N x N float tensors (the soft bin assignments, their
# products with the positive / negative masks and their gradients): 176 B at L = 10, which is the
# 2.9 GB at N = 4096 and 47 GB at N = 16384 measured on an H200 (issue 39). RankedListLoss: about
# 12 N x N floats (distances, masks, weights, their gradients): 12.5 GB at N = 16384.
def pml_bytes(loss: str, n: int, num_bins: int = 10) -> int:
    """Predicted peak bytes of PML's ``loss`` (``"fastap"`` or ``"ranked_list"``) at N."""
    floats_per_pair = 4 * (num_bins + 1) if loss == "fastap" else 12
    return 4 * floats_per_pair * n * n


def memory_limit_bytes(device: str) -> int:
    """What a case may use: 90% of the GPU's total memory on CUDA, 80% of the physical memory on
    the CPU."""
    if device == "cuda":
        return int(0.9 * torch.cuda.get_device_properties(0).total_memory)
    return int(0.8 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def pml_skip_reason(loss: str, n: int, device: str, num_bins: int = 10) -> str | None:
    """``"would need X GB ..."`` when PML's predicted memory exceeds :func:`memory_limit_bytes`,
    else ``None``."""
    need, limit = pml_bytes(loss, n, num_bins), memory_limit_bytes(device)
    if need <= limit:
        return None
    return f"would need {need / 1e9:.0f} GB (O(N^2) model), {limit / 1e9:.0f} GB usable"


@contextlib.contextmanager
def cuda_peak(device: torch.device) -> Iterator[dict]:
    """Yields a dict that gets ``"peak"``: the growth of ``torch.cuda.max_memory_allocated``
    over the memory allocated when the block started."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    box: dict = {}
    yield box
    box["peak"] = max(0, torch.cuda.max_memory_allocated(device) - baseline)
