"""Measurement skeleton shared by the benchmark scripts (Linux: reads ``/proc/self/statm``).

Every benchmark measures each case in a fresh subprocess that prints one JSON line; the parent
collects the lines and prints a Markdown table. Memory is the growth of the resident set size
(RSS) over its value just before the measured calls; time is the best of several calls after
untimed warm-up calls. A script keeps only its cases, its own flags and its table's columns:

* :func:`add_timing_flags` -- ``--warmup``, ``--repeats``, ``--rounds``, ``--threads``,
  ``--smoke`` and the hidden ``--child CASE NUMBER...`` that re-enters the script in a subprocess;
* :func:`bench_main` -- a child prints ``run_case(CASE, *NUMBERS)`` as JSON, the parent reports;
* :func:`measure_cases` -- each case in fresh subprocesses, ``--rounds`` interleaved rounds;
* :func:`print_header` / :func:`print_row` / :func:`mib` -- the table;
* :func:`add_load_flags` / :func:`competing_load` / :func:`machine_load` -- ``--load none|train|
  spawn``: a competing CPU load (``benchmarks/_load.py``) started by the script for the whole
  measurement, bounded by ``--load-limit`` seconds and stopped when the table is done;
* :func:`report_pairwise` -- the pairwise benchmarks' table (one row per ``--sizes`` entry) under
  that load;
* :func:`add_device_flags` -- ``--device auto|cpu|cuda``, ``--autocast none bfloat16 ...`` (one
  table per autocast dtype), ``--json PATH`` (the results, machine-readable) and ``--in-process``
  (every case in the script's own process, one after another: no interpreter or CUDA start-up per
  case, as ``scripts/gpu_check.py`` needs; CUDA peaks stay exact since each case resets
  ``torch.cuda``'s peak statistics, while a CPU peak is not measured -- ``ru_maxrss`` never goes
  down -- and is reported as ``-``). A case that fails in-process (e.g. CUDA out of memory) is
  recorded with its error instead of stopping the table.

``--smoke`` checks that a script runs, quickly (``tests/test_benchmarks.py``): every case once
(no warm-up, one timed call, one round) in the script's own process, so the script costs one
interpreter start instead of one or two per case and round. A CPU case's peak is still its own:
the process's peak RSS is reset before each case (:func:`reset_peak_rss`). A failing case stops
the script with its traceback. The numbers are not measurements (one cold call, no allocator
setting): the table's shape and every code path are what a smoke run checks.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from _backends import (
    NEEDS_CUDA,
    CaseSkipped,
    adaptive_repeats,
    add_backend_flags,
    apply_settings,
    backend_context,
    check_deadline,
    count_call,
    cuda_peak,
    flatten,
    graphed_step,
    guarded_first_calls,
    int_list,
    settings,
    split_case,
    split_graph,
)

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
# Without a fixed mmap threshold glibc keeps freed medium-sized blocks in its heap, so RSS would
# report allocator caching rather than live memory; with it, every large buffer is mmap'ed and
# returned to the OS when freed. Applied to every case of a benchmark alike.
LOW_MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``ru_maxrss``), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """Resets this process's peak RSS (``VmHWM``, which ``ru_maxrss`` reads) to its current RSS.

    Writes ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0, ``man 5 proc``), so the next
    :func:`time_calls` in this process measures its own peak, as in a fresh process.

    Raises:
        OSError: the kernel refuses the reset (the message names the file).
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def time_calls(step: Callable[[], object], warmup: int, repeats: int) -> dict:
    """Runs ``step`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns ``{"time": best timed call (s), "peak": peak RSS growth (bytes) over the RSS before
    the first call, warm-up included}``. The peak is the process's ``ru_maxrss``, so call this once
    per fresh process.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    baseline = rss_bytes()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"time": min(times), "peak": max(0, peak_rss_bytes() - baseline)}


def run_json(args: Iterable[str], env_extra: dict | None = None) -> dict:
    """Runs ``python <args>`` with the repository on ``PYTHONPATH`` and returns the JSON object
    on its last output line; a failing child raises with its stderr."""
    args = [str(arg) for arg in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_over_rounds(measure: Callable[[str], dict], cases: list[str], rounds: int) -> dict:
    """Measures every case ``rounds`` times, interleaved (case 1, case 2, ..., case 1, ...), and
    keeps per case the best ``"time"`` and the largest ``"peak"`` (``None``: not measured).

    On a shared or virtualized machine one subprocess can be slowed by unrelated load;
    interleaving exposes all cases to the same conditions and the best time discards the noise.
    A result with an ``"error"`` (in-process runs only) or ``"skipped"`` (a case not measured on
    purpose, :class:`_backends.CaseSkipped`) is kept only when no round succeeded.
    """
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for case in cases:
            result = measure(case)
            prior = best.get(case)
            if prior is not None and not failed(prior):
                if failed(result):
                    continue
                result["time"] = min(result["time"], prior["time"])
                if result["peak"] is not None and prior["peak"] is not None:
                    result["peak"] = max(result["peak"], prior["peak"])
            best[case] = result
    return best


def failed(result: dict) -> bool:
    """Whether ``result`` holds no measurement (an ``"error"`` or a ``"skipped"`` case)."""
    return "error" in result or "skipped" in result


def run_case_safely(run_case: Callable[..., dict], case: str, numbers: Sequence) -> dict:
    """``run_case(case, *numbers)``, or ``{"time": None, "peak": None, "skipped": reason}`` when
    the case raised :class:`_backends.CaseSkipped` (time guard, time budget)."""
    try:
        return run_case(case, *numbers)
    except CaseSkipped as skipped:
        return {"time": None, "peak": None, "skipped": str(skipped)}


# -- command line -------------------------------------------------------------------------------
def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first line of the script's docstring ``doc``."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def add_timing_flags(
    parser: argparse.ArgumentParser,
    unit: str = "calls",
    repeats: int = 5,
    threads: int | None = 2,
    threads_help: str | None = None,
) -> None:
    """Adds ``--warmup``, ``--repeats``, ``--rounds``, ``--threads``, ``--smoke`` and the hidden
    ``--child``.

    Args:
        parser: the script's parser.
        unit: what one timed call is called in the help (``"calls"`` or ``"steps"``).
        repeats: default of ``--repeats``.
        threads: default of ``--threads``; ``None`` for a script without the flag.
        threads_help: help of ``--threads``.
    """
    parser.add_argument("--warmup", type=int, default=1, help=f"untimed {unit} first")
    parser.add_argument("--repeats", type=int, default=repeats, help=f"timed {unit}; best is kept")
    parser.add_argument("--rounds", type=int, default=2, help="subprocess rounds per case")
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads, help=threads_help)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script runs: every case once in this process (0 warm-up, 1 timed "
        f"{unit[:-1]}, 1 round); the numbers are not measurements",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


SMOKE_NOTE = (
    "smoke run (--smoke): every case once in this process; the numbers are not measurements"
)


def add_pairwise_flags(parser: argparse.ArgumentParser, sizes: list[int]) -> None:
    """The flags of an "ours vs PML vs floor at each N" script: ``--sizes``, ``--dim``, the
    timing flags, ``--pml-max``, the load flags, the device flags (CPU by default) and the
    backend flags (``--backends``, ``--time-guard``, ``--budget-s``, ``--cpu-backend-max``,
    ``--cuda-graph``: ``_backends.add_backend_flags``).

    Args:
        parser: the script's parser.
        sizes: default of ``--sizes``.
    """
    parser.add_argument(
        "--sizes",
        type=int_list,
        nargs="+",
        default=sizes,
        help="N values, separated by spaces or commas (256,1024,4096)",
    )
    parser.add_argument("--dim", type=int, default=128)
    add_timing_flags(parser)
    parser.add_argument("--pml-max", type=int, default=4096)
    add_load_flags(parser)
    add_device_flags(parser, default_device="cpu")
    add_backend_flags(parser, cuda_graph=True)


DEVICES = ("cpu", "cuda")
PEAK_NAMES = {"cpu": "RSS growth", "cuda": "growth of CUDA max_memory_allocated"}
AUTOCAST = ("none", "bfloat16", "float16")


def add_device_flags(parser: argparse.ArgumentParser, default_device: str) -> None:
    """Adds ``--device auto|cpu|cuda``, ``--autocast``, ``--json PATH`` and ``--in-process``.

    Args:
        parser: the script's parser.
        default_device: default of ``--device`` (``auto``: CUDA when a GPU is present).
    """
    parser.add_argument("--device", choices=["auto", *DEVICES], default=default_device)
    parser.add_argument(
        "--autocast",
        choices=AUTOCAST,
        nargs="+",
        default=["none"],
        help="forward under torch.autocast in this dtype (one table each); none: float32",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure every case in this process (fast start; CPU peak memory not measured)",
    )


def resolve_device(name: str, script: str) -> str:
    """``--device``: ``auto`` is ``cuda`` when a GPU is present, else ``cpu``.

    Raises:
        SystemExit: ``cuda`` asked for without a usable GPU (the message names ``script``).
    """
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"{Path(script).name}: --device cuda, but no CUDA GPU is available "
            "(torch.cuda.is_available() is False): use --device cpu or auto"
        )
    return name


def device_label(device: str, threads: int | None, autocast: str = "none") -> str:
    """``"CPU, 2 threads"`` or the GPU's name, then ``", autocast bfloat16"`` unless float32."""
    where = f"CPU, {threads} threads" if device == "cpu" else torch.cuda.get_device_name()
    return where if autocast == "none" else f"{where}, autocast {autocast}"


def run_header(script: str, device: str, args: argparse.Namespace) -> dict:
    """The fields every benchmark's JSON starts with: the script, the device, the sizes' setup and
    the timing protocol."""
    return {
        "script": Path(script).name,
        "device": device,
        "device_name": device_label(device, args.threads),
        "dim": args.dim,
        "pml_max": args.pml_max,
        "timing": {"warmup": args.warmup, "repeats": args.repeats, "rounds": args.rounds},
        "in_process": args.in_process,
    }


def write_json(path: str | None, payload: dict) -> None:
    """``--json``: ``payload`` written to ``path`` (nothing without it)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1) + "\n")


# -- competing load -------------------------------------------------------------------------------
LOADS = ("none", "train", "spawn")
LOAD_NAMES = {
    "none": "no competing load",
    "train": "competing load: a one-thread training process",
    "spawn": "competing load: a niced loop starting short Python processes",
}


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    """Adds ``--load none|train|spawn`` and ``--load-limit`` (seconds after which the load stops
    by itself, should the script die without stopping it)."""
    parser.add_argument(
        "--load", choices=LOADS, default="none", help="competing CPU load during the measurement"
    )
    parser.add_argument("--load-limit", type=float, default=3600.0, help=argparse.SUPPRESS)


@contextmanager
def competing_load(kind: str, limit_s: float = 3600.0, settle_s: float = 1.0) -> Iterator[None]:
    """Runs ``benchmarks/_load.py kind`` (see there) while the block runs; ``"none"`` runs nothing.

    The load runs in its own process group, stopped (with every process it started) when the
    block ends, and stops by itself after ``limit_s`` seconds.

    Args:
        kind: ``"none"``, ``"train"`` or ``"spawn"``.
        limit_s: the load's own time limit.
        settle_s: seconds to let the load start before the block runs.
    """
    if kind not in LOADS:
        raise ValueError(f"unknown load {kind!r}; choose one of {', '.join(LOADS)}")
    if kind == "none":
        yield
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = str(Path(__file__).with_name("_load.py"))
    load = subprocess.Popen(
        [sys.executable, script, kind, str(limit_s)], env=env, start_new_session=True
    )
    try:
        time.sleep(settle_s)
        if load.poll() is not None:
            raise RuntimeError(f"competing load {kind!r} exited with code {load.returncode}")
        yield
    finally:
        if load.poll() is None:
            os.killpg(load.pid, signal.SIGTERM)
        load.wait()


def machine_load() -> str:
    """The 1, 5 and 15-minute load averages (as ``uptime`` prints them)."""
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def bench_main(
    parser: argparse.ArgumentParser,
    run_case: Callable[..., dict],
    report: Callable[[argparse.Namespace], None],
) -> None:
    """Parses the command line; a ``--child CASE NUMBER...`` call prints
    ``run_case(CASE, *map(int, NUMBERS))`` as one JSON line, any other call runs ``report``.

    Args:
        parser: the script's parser (with :func:`add_timing_flags`).
        run_case: measures one case in this process, returns ``{"time", "peak"}``.
        report: measures every case through subprocesses and prints the table.
    """
    args = parser.parse_args()
    if isinstance(getattr(args, "sizes", None), list):
        args.sizes = flatten(args.sizes)  # --sizes 256,1024 4096
    args.run_case = run_case  # for --in-process and --smoke (measure_in_child)
    if args.child:
        case, *numbers = args.child
        print(json.dumps(run_case_safely(run_case, case, list(map(int, numbers)))))
        return
    apply_settings(args)  # --time-guard, --budget-s, counting: read by every case
    if args.smoke:
        args.warmup, args.repeats, args.rounds = 0, 1, 1
        print(SMOKE_NOTE, flush=True)
    report(args)


# -- subprocesses ---------------------------------------------------------------------------------
def measure_in_child(
    script: str,
    case: str,
    numbers: Sequence[int],
    args: argparse.Namespace,
    memory_pass: bool = False,
    env_extra: dict | None = None,
) -> dict:
    """Measures ``case`` by running ``script --child case *numbers warmup repeats [threads]``
    (with ``--smoke``: :func:`measure_smoke`; with ``--in-process``: :func:`measure_in_process`).

    Args:
        script: the benchmark script (its ``__file__``).
        case: the case name.
        numbers: the script's own child arguments, before ``--warmup`` and ``--repeats``.
        args: the parsed command line; ``--threads`` is passed last when the script has it.
        memory_pass: take the peak from a second child (no warm-up, one call) run with
            :data:`LOW_MMAP_THRESHOLD`, keeping the allocator setting out of the timing run.
        env_extra: environment of the timing child on top of ours.
    """
    threads = [args.threads] if "threads" in args else []
    if getattr(args, "smoke", False):
        return measure_smoke(args.run_case, case, [*numbers, args.warmup, args.repeats, *threads])
    if getattr(args, "in_process", False):
        return measure_in_process(
            args.run_case, case, [*numbers, args.warmup, args.repeats, *threads]
        )
    child = [script, "--child", case, *numbers]
    timing = run_json(child + [args.warmup, args.repeats, *threads], env_extra)
    if not memory_pass:
        return timing
    memory = run_json(child + [0, 1, *threads], LOW_MMAP_THRESHOLD)
    return {"time": timing["time"], "peak": memory["peak"]}


def collect_garbage() -> None:
    """``gc.collect()``, then ``gc.freeze()``: what survives (the imported modules, about 200,000
    objects after torch and PML) is left out of later collections, so the collection between
    two in-process cases scans only what the last case made (0.1 s of CPU less per case; a
    case's garbage is always younger than the last freeze, so it is still collected)."""
    gc.collect()
    gc.freeze()


def measure_in_process(run_case: Callable[..., dict], case: str, numbers: Sequence[int]) -> dict:
    """``run_case(case, *numbers)`` in this process: ``{"time", "peak"}``, the peak ``None`` unless
    it is a CUDA peak (an RSS peak is the process's, not the case's), or ``{"time": None, "peak":
    None, "error": "...", "traceback": "..."}`` when the case raised (CUDA out of memory: ``"out
    of memory"``), or a ``"skipped"`` result (:func:`run_case_safely`)."""
    error = trace = None
    try:
        result = run_case_safely(run_case, case, numbers)
    except torch.cuda.OutOfMemoryError:
        error = "out of memory"
    except Exception as e:  # noqa: BLE001 -- recorded in the table/JSON, the next case runs
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        trace = traceback.format_exc()
    collect_garbage()  # the failed case's tensors (held by the traceback) before the next case
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if error is not None:
        return {"time": None, "peak": None, "error": error, "traceback": trace}
    if result.pop("peak_kind", "rss") != "cuda":
        result["peak"] = None
    return result


def measure_smoke(run_case: Callable[..., dict], case: str, numbers: Sequence[int]) -> dict:
    """``--smoke``: ``run_case(case, *numbers)`` in this process after :func:`reset_peak_rss`, so
    a CPU peak is the case's own; an exception propagates (a smoke run fails on a broken case)."""
    collect_garbage()  # the previous case's tensors, before the peak is reset
    reset_peak_rss()
    result = run_case_safely(run_case, case, numbers)
    result.pop("peak_kind", None)
    return result


def measure_cases(
    script: str, cases: list[str], numbers: Sequence[int], args: argparse.Namespace, **kwargs
) -> dict:
    """Every case through :func:`measure_in_child` (``kwargs`` go there), ``args.rounds``
    interleaved rounds (:func:`best_over_rounds`): ``{case: {"time", "peak"}}``."""
    measure = partial(measure_in_child, script, numbers=numbers, args=args, **kwargs)
    return best_over_rounds(measure, cases, args.rounds)


def measure_sizes(
    script: str, cases: list[str], args: argparse.Namespace, device: str, autocast: str
) -> Iterable[tuple[int, dict]]:
    """For each N of ``--sizes``: ``(N, measure_cases(...))`` with child numbers ``N, --dim``,
    the device and autocast codes; the case ``"pml"`` is left out above ``--pml-max``."""
    codes = [DEVICES.index(device), AUTOCAST.index(autocast)]
    for n in args.sizes:
        kept = [case for case in cases if case != "pml" or n <= args.pml_max]
        yield n, measure_cases(script, kept, [n, args.dim, *codes], args)


# -- inside a child -------------------------------------------------------------------------------
def time_backward(x: torch.Tensor, compute: Callable[[], torch.Tensor], warmup: int, repeats: int):
    """:func:`time_calls` of ``compute().backward()``, clearing ``x.grad`` before each call; on a
    CUDA ``x``, :func:`time_backward_cuda`.

    With ``--time-guard`` (:func:`_backends.settings`) the first call is timed alone and the case
    skipped (:class:`_backends.CaseSkipped`) when it, and a second try, take longer; with
    counting on (``--backends``) one more call is counted (:func:`_backends.count_call`: aten
    operators and syncing ones on the CPU) and the counts join the result."""
    if x.is_cuda:
        return time_backward_cuda(x, compute, warmup, repeats)

    def step():
        x.grad = None
        compute().backward()

    options = settings()
    first = guarded_first_calls(step, False, options["guard_s"])
    result = time_calls(step, max(0, warmup - len(first)), repeats)
    if options["count"]:
        result.update(count_call(step, cuda=False))
    return result


def time_backward_cuda(x: torch.Tensor, compute, warmup: int, repeats: int) -> dict:
    """:func:`time_backward` on a GPU: ``"time"`` is the median of the timed calls, each
    measured with CUDA events and followed by ``torch.cuda.synchronize`` (so one call's host work
    never overlaps the next call's kernels), ``"best"`` the fastest; the timed calls stop once
    they add up to about 1.5 s at the last warm-up call's speed (:func:`_backends.
    adaptive_repeats`, at least 3; that call is timed, or one more is made). The peak is
    the growth of ``torch.cuda.max_memory_allocated`` over the memory allocated before the first
    call, warm-up included (``"peak_kind": "cuda"``). ``--time-guard`` and counting (kernels,
    host syncs, device-to-host copies: :func:`_backends.count_cuda`) as in
    :func:`time_backward`; ``"first_call_s"`` is the first call's time (compiles included)."""

    def step():
        x.grad = None
        compute().backward()

    options = settings()
    with cuda_peak(x.device) as memory:
        first = guarded_first_calls(step, True, options["guard_s"])
        for _ in range(max(0, warmup - len(first)) - 1):
            step()
        probe = call_seconds_cuda(step)  # the last warm-up call (compiles done), timed
        times = []
        for _ in range(adaptive_repeats(repeats, probe)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(x.device)
            times.append(start.elapsed_time(end) / 1e3)
    result = {
        "time": statistics.median(times),
        "best": min(times),
        "repeats": len(times),
        "first_call_s": first[0] if first else probe,
        "peak": memory["peak"],
        "peak_kind": "cuda",
    }
    if options["count"]:
        result.update(count_call(step, cuda=True))
    return result


def call_seconds_cuda(step: Callable[[], object]) -> float:
    """Wall time of one ``step()`` until the GPU has finished it."""
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def under_autocast(
    compute: Callable[[], torch.Tensor], device: torch.device, autocast: str
) -> Callable[[], torch.Tensor]:
    """``compute`` run under ``torch.autocast(device.type, dtype)`` (``"none"``: unchanged); the
    backward runs outside, as in a training step."""
    if autocast == "none":
        return compute
    dtype = getattr(torch, autocast)

    def wrapped() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype):
            return compute()

    return wrapped


def product_floor(x: torch.Tensor, ref: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``S = x @ ref.T; (S * S).sum()``: the cost of touching every pair once."""
    return lambda: (lambda s: (s * s).sum())(x @ ref.T)


def run_pairwise_case(
    make_loss: Callable[[str], Callable],
    case: str,
    n: int,
    dim: int,
    device_code: int,
    autocast_code: int,
    warmup: int,
    repeats: int,
    threads: int,
) -> dict:
    """One case of an "at each N" script: ``n`` random ``dim``-d embeddings, 4 per class, on
    ``DEVICES[device_code]``, the loss ``make_loss(case)`` or, for ``case == "floor"``,
    :func:`product_floor`, forward under ``AUTOCAST[autocast_code]``. A case ``"NAME@BACKEND"``
    runs ``make_loss(NAME)`` with ``use_backend(BACKEND)`` around every call (forward and
    backward); ``"NAME@BACKEND+graph"`` captures it in a CUDA graph first
    (:func:`_backends.graphed_step`). Raises :class:`_backends.CaseSkipped` once ``--budget-s``
    has run out, and for a graphed case off CUDA."""
    check_deadline()
    case, backend = split_case(case)
    backend, graph = split_graph(backend)
    if graph and DEVICES[device_code] != "cuda":
        raise CaseSkipped(NEEDS_CUDA)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    device = torch.device(DEVICES[device_code])
    x = torch.randn(n, dim).to(device).requires_grad_(True)
    labels = (torch.arange(n) // 4).to(device)
    if case == "floor":
        compute = product_floor(x, x)
    else:
        loss_fn = make_loss(case)
        compute = lambda: loss_fn(x, labels)  # noqa: E731
    if graph:  # the forward's autocast is inside the graph
        compute = graphed_step(loss_fn, x, labels, AUTOCAST[autocast_code])
    else:
        compute = under_autocast(compute, device, AUTOCAST[autocast_code])
    with backend_context(backend):
        return time_backward(x, compute, warmup, repeats)


# -- the table ------------------------------------------------------------------------------------
def print_header(columns: list[str], text_first: bool = True) -> None:
    """A Markdown table header; every column right-aligned but a text first column."""
    print("| " + " | ".join(columns) + " |")
    print(
        "| " + " | ".join(["---" if text_first else "---:"] + ["---:"] * (len(columns) - 1)) + " |"
    )


def print_row(cells: Iterable) -> None:
    """One Markdown table row, flushed."""
    print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


def mib(result: dict | None) -> str:
    """``result["peak"]`` in whole MiB; ``"-"`` when not measured."""
    if result is None or result.get("peak") is None:
        return "-"
    return f"{result['peak'] / 2**20:.0f}"


def seconds(result: dict | None) -> str:
    """``result["time"]`` in seconds; ``"skipped"`` for a case not run, ``"error"`` for a failed
    in-process case (its error is in the JSON and printed below the table)."""
    if result is None or "skipped" in result:
        return "skipped"
    return "error" if "error" in result else f"{result['time']:.3f}"


def ratio(numerator: dict | None, denominator: dict | None, key: str = "time") -> float | None:
    """``numerator[key] / denominator[key]``, or ``None`` when either is missing or failed."""
    if numerator is None or denominator is None:
        return None
    top, bottom = numerator.get(key), denominator.get(key)
    if top is None or bottom is None:
        return None
    return top / max(bottom, 1e-12 if key == "time" else 1)


def times_cell(value: float | None, digits: int = 1) -> str:
    """``"12.3x"``, ``"-"`` for ``None``."""
    return "-" if value is None else f"{value:.{digits}f}x"


def versus_pml(ours: dict, pml: dict | None) -> tuple[str, str]:
    """``("PML / ours" time, "ours / PML" memory)`` cells; ``"-"`` when PML was skipped or either
    failed or a peak was not measured."""
    speed, memory = ratio(pml, ours), ratio(pml, ours, "peak")
    return times_cell(speed), "-" if memory is None else f"1/{memory:.0f}"


def report_pairwise(
    script: str,
    cases: list[str],
    args: argparse.Namespace,
    title: str,
    columns: list[str],
    size_row: Callable[[int, dict], list],
    pml_cost: str,
) -> None:
    """The tables of a pairwise benchmark, one per ``--autocast`` dtype: ``title`` (a format
    string with ``{where}``, :func:`device_label`, and ``{peak}``, :data:`PEAK_NAMES`) with the competing load (``--load``, run for
    the whole measurement) and the load average before, one row ``size_row(N, best)`` per size
    (:func:`measure_sizes`), then the load average after, :func:`note_pml_skipped` and the
    errors of failed in-process cases; ``--json``: every result."""
    device = resolve_device(args.device, script)
    tables = []
    for autocast in args.autocast:
        rows = []
        with competing_load(args.load, args.load_limit):
            where = device_label(device, args.threads, autocast)
            peak = PEAK_NAMES[device] if not args.in_process or device == "cuda" else "not measured"
            heading = title.format(where=where, peak=peak)
            print(f"{heading}; {LOAD_NAMES[args.load]}; before: {machine_load()}")
            print_header(columns, text_first=False)
            for n, best in measure_sizes(script, cases, args, device, autocast):
                print_row(size_row(n, best))
                rows.append({"n": n, "cases": best})
        print(f"after: {machine_load()}")
        note_pml_skipped(args, pml_cost)
        print_failures(rows)
        tables.append({"autocast": autocast, "sizes": rows})
    write_json(args.json, {**run_header(script, device, args), "tables": tables})


def print_failures(rows: list[dict]) -> None:
    """Below a table: each failed case's error (with its traceback, in-process) and each skipped
    case's reason, ``N=... case: ...``."""
    for row in rows:
        for case, result in row["cases"].items():
            if "error" in result:
                print(f"N={row['n']} {case}: {result['error']}")
                if result.get("traceback"):
                    print("```\n" + result["traceback"].rstrip() + "\n```")
            elif "skipped" in result:
                print(f"N={row['n']} {case}: skipped: {result['skipped']}")


def note_pml_skipped(args: argparse.Namespace, cost: str) -> None:
    """Says below the table that PML was skipped above ``--pml-max`` (for its ``cost``)."""
    if any(n > args.pml_max for n in args.sizes):
        print(f"PML skipped above N={args.pml_max} (--pml-max): {cost} memory.")
