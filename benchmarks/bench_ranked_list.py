"""RankedListLoss forward+backward: ours vs PML's RankedListLoss vs the N x N product floor.

For each N (d = 128, labels with 4 items per class, alpha 1.2, margin 0.4, Tn 10) and each
case, a fresh subprocess builds the inputs, reads its resident set size (RSS,
/proc/self/statm), runs forward+backward ``--warmup`` untimed times and then ``--repeats`` timed
times, and reports the best timed call and the peak RSS growth over the pre-call RSS
(``ru_maxrss`` minus that baseline, warm-up included). The cases of one N are measured in turn,
``--rounds`` times over (fresh subprocesses each round), keeping each case's best time and
largest peak (shared harness: ``benchmarks/_measure.py``). Cases:

* ours    -- ``pml_rank_plugins.losses.RankedListLoss`` (default ``gallery_gradient=False``:
  gradient through the query side of each list, the paper's sec. 3.2);
* ours_gg -- the same with ``gallery_gradient=True`` (both ends of every pair, as PML);
* pml     -- ``pytorch_metric_learning.losses.RankedListLoss(margin=0.4, Tn=10,
  imbalance=0.5, alpha=1.2)`` (skipped above ``--pml-max``: O(N^2) floats, several of them);
* floor   -- ``S = X @ X.T; (S * S).sum().backward()``, the cost of touching every pair once.

Targets (CPU, 2 threads, N = 4096): ours >= 5x faster than PML and <= 1.5x the floor; ours'
peak memory growth <= 1/8 of PML's; N = 16384 (``--sizes 16384``) under 1 GiB of growth.
Run: ``python benchmarks/bench_ranked_list.py [--sizes 1024 4096 16384]``.
"""

from __future__ import annotations

import argparse
import json
import warnings
from functools import partial

from _measure import best_over_rounds, run_json, time_calls

CASES = ["ours", "ours_gg", "floor", "pml"]


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
        if case == "pml":
            from pytorch_metric_learning.losses import RankedListLoss

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PML warns for any Tn > 5
                loss_fn = RankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2)
        else:
            from pml_rank_plugins.losses import RankedListLoss

            loss_fn = RankedListLoss(
                margin=0.4, alpha=1.2, Tn=10.0, gallery_gradient=case == "ours_gg"
            )
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
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
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
        f"RankedListLoss forward+backward, CPU, {args.threads} threads, d={args.dim}, "
        "alpha 1.2, margin 0.4, Tn 10, 4 per class, "
        f"{args.warmup} warm-up call(s), best of {args.repeats} timed x {args.rounds} rounds; "
        "peak = RSS growth during all calls; ours = gallery_gradient=False, gg = True"
    )
    print(
        "| N | ours s | ours gg s | PML s | floor s | PML / ours | PML / ours gg | ours / floor "
        "| ours gg / floor | ours MiB | ours gg MiB | PML MiB | floor MiB | ours / PML mem |"
    )
    print("| ---: " * 14 + "|")
    for n in args.sizes:
        cases = [c for c in CASES if c != "pml" or n <= args.pml_max]
        best = best_over_rounds(partial(measure, n=n, args=args), cases, args.rounds)
        ours, gg, floor, pml = best["ours"], best["ours_gg"], best["floor"], best.get("pml")
        mib = lambda r: f"{r['peak'] / 2**20:.0f}"  # noqa: E731
        row = [
            n,
            f"{ours['time']:.3f}",
            f"{gg['time']:.3f}",
            f"{pml['time']:.3f}" if pml else "skipped",
            f"{floor['time']:.3f}",
            f"{pml['time'] / ours['time']:.1f}x" if pml else "-",
            f"{pml['time'] / gg['time']:.1f}x" if pml else "-",
            f"{ours['time'] / floor['time']:.2f}x",
            f"{gg['time'] / floor['time']:.2f}x",
            mib(ours),
            mib(gg),
            mib(pml) if pml else "-",
            mib(floor),
            f"1/{pml['peak'] / max(ours['peak'], 1):.0f}" if pml else "-",
        ]
        print("| " + " | ".join(str(v) for v in row) + " |", flush=True)
    if any(n > args.pml_max for n in args.sizes):
        print(f"PML skipped above N={args.pml_max} (--pml-max): O(N^2) memory.")


if __name__ == "__main__":
    main()
