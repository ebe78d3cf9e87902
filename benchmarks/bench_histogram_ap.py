"""FastAP and mAP_Q forward+backward: ours vs PML's FastAPLoss vs the N x N product floor.

For each N (d=128, 10 bins, labels with 4 items per class) and each case, a fresh subprocess
builds the inputs, reads its resident set size (RSS, /proc/self/statm), runs forward+backward
``--warmup`` untimed times (thread pools, allocator, first-touch pages) and then ``--repeats``
timed times, and reports the best timed call and the peak RSS growth over the pre-call RSS
(``ru_maxrss`` minus that baseline, warm-up included). The cases of one N are measured in turn,
``--rounds`` times over (fresh subprocesses each round), keeping each case's best time and
largest peak: on a shared or virtualized machine a single subprocess can be slowed by unrelated
load, and interleaved rounds expose every case to the same conditions. Cases:

* ours  -- ``pml_rank_plugins.losses.FastAPLoss`` (automatic query chunking);
* qap   -- ``pml_rank_plugins.losses.QuantizedAPLoss(num_bins=20)`` (mAP_Q, same kernel; PML has
  no mAP_Q, so its "x PML" column compares with PML's FastAP);
* pml   -- ``pytorch_metric_learning.losses.FastAPLoss`` (skipped above ``--pml-max``: it needs
  O(L N^2) memory, about 12 GB at N = 8192);
* floor -- ``S = X @ X.T; (S * S).sum().backward()``, the cost of touching every pair once.

``--load train|spawn`` runs a competing CPU load (``benchmarks/_load.py``: a one-thread training
process, or a niced loop starting short Python processes) during the whole measurement, floor
and PML included; the script starts it and stops it. The load averages before and after are
printed with the table.

Targets (CPU, N = 4096): ours >= 15x faster than PML and <= 3x the floor; ours' peak memory
growth <= 1/8 of PML's; N = 16384 (``--sizes 16384``) within 8 GB. Under ``--load train``
(threads = cores): FastAP and mAP_Q <= 1.5x the floor and >= 5x PML; under ``--load spawn``:
never slower than PML and <= 2x the floor.
``--device cuda`` measures on the GPU (peak = growth of ``torch.cuda.max_memory_allocated``),
``--autocast bfloat16`` runs the forward under ``torch.autocast`` (one table per dtype given),
``--json PATH`` writes the results, ``--in-process`` measures every case in this process
(``benchmarks/_measure.py``; used by ``scripts/gpu_check.sh``).
``--backends gpu,triton`` adds one row per backend beside PML and the floor, and ``--cuda-graph``
a twin of each (``gpu+graph``, ``triton+graph``): the loss captured once with
``torch.cuda.make_graphed_callables`` and replayed, same timing, ratios and counts ("skipped:
needs CUDA" on the CPU; ``benchmarks/_backend_report.py``).
Run: ``python benchmarks/bench_histogram_ap.py [--sizes 256 1024 4096 8192] [--load train]
[--device cpu|cuda] [--autocast none bfloat16] [--json PATH] [--in-process]``.
"""

from __future__ import annotations

from functools import partial

from _backend_report import report_backends
from _measure import (
    add_pairwise_flags,
    bench_main,
    bench_parser,
    mib,
    ratio,
    report_pairwise,
    run_pairwise_case,
    seconds,
    times_cell,
    versus_pml,
)
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss

CASES = ["ours", "qap", "floor", "pml"]
COLUMNS = [
    "N",
    "ours s",
    "PML s",
    "floor s",
    "PML / ours",
    "ours / floor",
    "ours MiB",
    "PML MiB",
    "floor MiB",
    "ours / PML mem",
    "mAP_Q s",
    "PML / mAP_Q",
    "mAP_Q / floor",
    "mAP_Q MiB",
]


def make_loss(case: str):
    """The loss of ``case``: ``"ours"`` / ``"pml"`` (FastAP, 10 bins), ``"qap"`` (mAP_Q, 20)."""
    if case == "qap":
        return QuantizedAPLoss(num_bins=20)
    return (FastAPLoss if case == "ours" else PMLFastAPLoss)(num_bins=10)


SPEC = {
    "losses": ["ours", "qap"],
    "labels": {"ours": "FastAP", "qap": "mAP_Q", "pml": "PML FastAP", "floor": "floor"},
    "pml_loss": "fastap",
    "num_bins": 10,
}


def report(args) -> None:
    """Measures every size and case, prints the table (``--backends``: one row per backend)."""
    if args.backends:
        title = (
            "FastAP (ours, PML: 10 bins) and mAP_Q (20 bins) forward+backward by backend, "
            f"{{where}}, d={args.dim}, {args.warmup} warm-up call(s), "
            f"{args.repeats} timed call(s) at most x {args.rounds} round(s); "
            "peak = {peak} during all calls; PML / case for mAP_Q is against PML's FastAP"
        )
        report_backends(__file__, args, title, SPEC)
        return
    title = (
        "FastAP (ours, PML: 10 bins) and mAP_Q (20 bins) forward+backward, {where}, "
        f"d={args.dim}, {args.warmup} warm-up call(s), best of "
        f"{args.repeats} timed x {args.rounds} rounds; peak = {{peak}} during all calls"
    )
    report_pairwise(__file__, CASES, args, title, COLUMNS, size_row, "O(L N^2)")


def size_row(n: int, best: dict) -> list:
    """The table row of size ``n`` from its cases' results (``"skipped"`` / ``"-"`` for a case
    not run or failed)."""
    ours, qap, floor, pml = best["ours"], best["qap"], best["floor"], best.get("pml")
    speedup, memory = versus_pml(ours, pml)
    return [
        n,
        seconds(ours),
        seconds(pml),
        seconds(floor),
        speedup,
        times_cell(ratio(ours, floor), 2),
        mib(ours),
        mib(pml),
        mib(floor),
        memory,
        seconds(qap),
        versus_pml(qap, pml)[0],
        times_cell(ratio(qap, floor), 2),
        mib(qap),
    ]


def main() -> None:
    parser = bench_parser(__doc__)
    add_pairwise_flags(parser, sizes=[256, 1024, 4096, 8192])
    bench_main(parser, partial(run_pairwise_case, make_loss), report)


if __name__ == "__main__":
    main()
