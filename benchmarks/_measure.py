"""Measurement helpers shared by the benchmark scripts (Linux: reads ``/proc/self/statm``).

Every benchmark measures each case in a fresh subprocess that prints one JSON line; the parent
collects the lines. Memory is the growth of the resident set size (RSS) over its value just
before the measured calls; time is the best of several calls after untimed warm-up calls.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

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
    keeps per case the best ``"time"`` and the largest ``"peak"``.

    On a shared or virtualized machine one subprocess can be slowed by unrelated load;
    interleaving exposes all cases to the same conditions and the best time discards the noise.
    """
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for case in cases:
            result = measure(case)
            if case in best:
                result["time"] = min(result["time"], best[case]["time"])
                result["peak"] = max(result["peak"], best[case]["peak"])
            best[case] = result
    return best
