"""Benchmark: our RankedListLoss vs PML 2.9.0's, forward + backward, same run, as ratios.

Usage: ``python benchmarks/bench_ranked_list.py [--sizes 1024 4096] [--dim 128] [--repeats 5]``

Setup: N L2-normalized-by-the-loss random embeddings of dimension ``--dim`` (default 128),
4 samples per class, CPU, ``torch.set_num_threads(--threads)`` (default 1). Both losses use
alpha 1.2, margin 0.4, Tn 10 (PML: ``imbalance=0.5``; ours: ``lam=1``, and we report ours with
both ``gallery_gradient`` settings; ``True`` differentiates the same graph as PML's).

Time: all losses in one fresh subprocess (default allocator settings), one warm-up call each,
then calls interleaved round-robin (so load from other processes hits every loss alike) for at
least ``--repeats`` rounds and ``--min-seconds`` (3 s) per loss; the median per loss.

Peak memory: every (loss, N) is measured in its own fresh subprocess. A thread polls the
resident set size (``/proc/self/statm``, field 2 times the page size) every 0.2 ms during one forward +
backward (after a warm-up call) and reports the peak growth over the RSS just before the call.
The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so glibc serves every large buffer
with ``mmap`` and returns it to the OS on free; otherwise freed arenas from the warm-up call would
hide the growth. Linux only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import warnings

from _measure import LOW_MMAP_THRESHOLD, rss_bytes, run_json

CONFIGS = {
    "pml": "PML RankedListLoss",
    "ours": "ours (gallery_gradient=False)",
    "ours_gg": "ours (gallery_gradient=True)",
}


class PeakRSS:
    """Context manager: peak RSS growth (bytes) over the RSS at entry, by polling in a thread."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.0002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.growth = self.peak - self.base


def _make_loss(name: str):
    if name == "pml":
        from pytorch_metric_learning.losses import RankedListLoss

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PML warns for Tn > 5
            return RankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2)
    from pml_rank_plugins.losses import RankedListLoss

    return RankedListLoss(margin=0.4, alpha=1.2, Tn=10.0, gallery_gradient=name == "ours_gg")


def _step_fn(name: str, x0, labels):
    loss_fn = _make_loss(name)

    def step():
        x = x0.clone().requires_grad_()
        loss = loss_fn(x, labels)
        loss.backward()
        return loss.item()

    return step


def worker(
    names: list[str],
    n: int,
    dim: int,
    repeats: int,
    threads: int,
    measure: str,
    min_seconds: float = 3.0,
) -> dict:
    """Run in a fresh process.

    ``measure="time"``: all ``names`` in this one process, calls interleaved round-robin so that
    load from other processes hits every loss alike; median seconds per loss.
    ``measure="memory"``: one loss (``names[0]``); peak RSS growth of one call after a warm-up.
    """
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(n, dim, generator=gen)
    labels = torch.arange(n) // 4
    steps = {name: _step_fn(name, x0, labels) for name in names}
    values = {name: step() for name, step in steps.items()}  # warm-up
    if measure == "memory":
        (name,) = names
        with PeakRSS() as mem:
            steps[name]()
        return {name: {"peak_mb": mem.growth / 2**20, "loss": values[name]}}
    times = {name: [] for name in names}
    start = time.perf_counter()
    while len(times[names[0]]) < repeats or time.perf_counter() - start < min_seconds * len(names):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return {
        name: {"time_s": statistics.median(t), "loss": values[name]} for name, t in times.items()
    }


def run_in_subprocess(names: list[str], n: int, args, measure: str) -> dict:
    cmd = [__file__, "--worker", *names, "--n", n, "--dim", args.dim]
    cmd += ["--repeats", args.repeats, "--threads", args.threads, "--measure", measure]
    cmd += ["--min-seconds", args.min_seconds]
    return run_json(cmd, LOW_MMAP_THRESHOLD if measure == "memory" else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-seconds", type=float, default=3.0, help="timing per loss, at least")
    parser.add_argument("--worker", choices=sorted(CONFIGS), nargs="+")
    parser.add_argument("--n", type=int)
    parser.add_argument("--measure", choices=["time", "memory"], default="time")
    args = parser.parse_args()
    if args.worker:
        result = worker(
            args.worker,
            args.n,
            args.dim,
            args.repeats,
            args.threads,
            args.measure,
            args.min_seconds,
        )
        print(json.dumps(result))
        return

    print(f"RankedListLoss forward+backward, CPU, {args.threads} thread(s), dim {args.dim},")
    print("4 samples/class; time = median of interleaved calls; peak = RSS growth during one call")
    print("| N | loss | time (s) | peak mem (MiB) | speed-up vs PML | memory vs PML |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in args.sizes:
        res = run_in_subprocess(list(CONFIGS), n, args, "time")
        for name in CONFIGS:
            res[name] |= run_in_subprocess([name], n, args, "memory")[name]
        base = res["pml"]
        for name, label in CONFIGS.items():
            r = res[name]
            speed = base["time_s"] / r["time_s"]
            mem = r["peak_mb"] / base["peak_mb"]
            print(
                f"| {n} | {label} | {r['time_s']:.4f} | {r['peak_mb']:.1f} | "
                f"{speed:.2f}x | {mem:.2f}x |"
            )


if __name__ == "__main__":
    main()
