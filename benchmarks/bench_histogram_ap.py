"""FastAP forward+backward: ours vs PML's FastAPLoss vs the N x N product floor, same run.

For each N (d=128, 10 bins, labels with 4 items per class) and each case, a fresh subprocess
builds the inputs, reads its resident set size (RSS, /proc/self/statm), runs forward+backward
``--warmup`` untimed times (thread pools, allocator, first-touch pages) and then ``--repeats``
timed times, and reports the best timed call and the peak RSS growth over the pre-call RSS
(``ru_maxrss`` minus that baseline, warm-up included). The cases of one N are measured in turn,
``--rounds`` times over (fresh subprocesses each round), keeping each case's best time and
largest peak: on a shared or virtualized machine a single subprocess can be slowed by unrelated
load, and interleaved rounds expose every case to the same conditions. Cases:

* ours  -- ``pml_rank_plugins.losses.FastAPLoss`` (automatic query chunking);
* pml   -- ``pytorch_metric_learning.losses.FastAPLoss`` (skipped above ``--pml-max``: it needs
  O(L N^2) memory, about 12 GB at N = 8192);
* floor -- ``S = X @ X.T; (S * S).sum().backward()``, the cost of touching every pair once.

Targets (CPU, N = 4096): ours >= 15x faster than PML and <= 3x the floor; ours' peak memory
growth <= 1/8 of PML's; N = 16384 (``--sizes 16384``) within 8 GB.
Run: ``python benchmarks/bench_histogram_ap.py [--sizes 256 1024 4096 8192]``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from _measure import best_over_rounds, run_json, time_calls


def run_case(case: str, n: int, dim: int, warmup: int, repeats: int, threads: int) -> dict:
    """Runs inside the subprocess: returns best time (s) and peak RSS growth (bytes)."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(n, dim, requires_grad=True)
    labels = torch.arange(n) // 4
    if case == "floor":
        compute = lambda: (lambda s: (s * s).sum())(x @ x.T)  # noqa: E731
    else:
        if case == "ours":
            from pml_rank_plugins.losses import FastAPLoss
        else:
            from pytorch_metric_learning.losses import FastAPLoss
        loss_fn = FastAPLoss(num_bins=10)
        compute = lambda: loss_fn(x, labels)  # noqa: E731

    def step():
        x.grad = None
        compute().backward()

    return time_calls(step, warmup, repeats)


def measure(case: str, n: int, args) -> dict:
    child = [__file__, "--child", case, n, args.dim, args.warmup, args.repeats, args.threads]
    return run_json(child)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls; best is kept")
    parser.add_argument("--rounds", type=int, default=2, help="subprocess rounds per case")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pml-max", type=int, default=4096)
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, *numbers = args.child
        print(json.dumps(run_case(case, *map(int, numbers))))
        return
    print(
        f"FastAP forward+backward, CPU, {args.threads} threads, d={args.dim}, 10 bins, "
        f"{args.warmup} warm-up call(s), best of {args.repeats} timed x {args.rounds} rounds; "
        "peak = RSS growth during all calls"
    )
    print(
        "| N | ours s | PML s | floor s | PML / ours | ours / floor "
        "| ours MiB | PML MiB | floor MiB | ours / PML mem |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.sizes:
        cases = ["ours", "floor"] + (["pml"] if n <= args.pml_max else [])
        best = best_over_rounds(partial(measure, n=n, args=args), cases, args.rounds)
        ours, floor, pml = best["ours"], best["floor"], best.get("pml")
        mib = lambda r: f"{r['peak'] / 2**20:.0f}"  # noqa: E731
        row = [
            n,
            f"{ours['time']:.3f}",
            f"{pml['time']:.3f}" if pml else "skipped",
            f"{floor['time']:.3f}",
            f"{pml['time'] / ours['time']:.1f}x" if pml else "-",
            f"{ours['time'] / floor['time']:.2f}x",
            mib(ours),
            mib(pml) if pml else "-",
            mib(floor),
            f"1/{pml['peak'] / max(ours['peak'], 1):.0f}" if pml else "-",
        ]
        print("| " + " | ".join(str(v) for v in row) + " |", flush=True)
    if any(n > args.pml_max for n in args.sizes):
        print(f"PML skipped above N={args.pml_max} (--pml-max): O(L N^2) memory.")


if __name__ == "__main__":
    main()
