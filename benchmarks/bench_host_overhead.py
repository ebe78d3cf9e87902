"""Host time per call at tiny N: what a loss costs the CPU thread that drives a GPU.

At the batch sizes users train with (N <= 4096 on one H100/H200) the ``gpu`` / ``triton`` paths
are host-bound (issue 39): the GPU work of a forward + backward is well under a millisecond,
and the host spends a few milliseconds in Python, PML's ``forward`` machinery and the aten
dispatcher (each operator dispatched to CUDA costs roughly 5-20 us of host time), while the GPU
waits. This script measures that cost on any machine, at a size where the arithmetic is
negligible (default N = 8, d = 8, 4 items per class): for each of our losses (FastAP 10 bins,
mAP_Q 20 bins, RankedList) under each backend of ``--backends`` (``use_backend``) and for PML's
``FastAPLoss`` and ``RankedListLoss``, the median host microseconds of one forward + backward
(``time.perf_counter`` around the call, one torch thread, ``--repeats`` calls per round, the
best of ``--rounds`` interleaved rounds, so a loaded machine slows every case alike) and the
aten operators it dispatches (``pml_rank_plugins.utils.op_count.OpCounter``).

The ratio column compares each row with PML's loss of the same family measured in the same run
(``PML / case``: above 1 means less host time than PML): ratios, not absolute targets. Expected
effect on a GPU: about ``ops x 10 us`` of host time per call, plus the Python measured here.

Run: ``python benchmarks/bench_host_overhead.py [--n 8] [--dim 8] [--repeats 200]
[--rounds 3] [--warmup 10] [--backends cpu,gpu] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _backends import backend_context, backend_list
from op_counts import inputs, make_loss

from pml_rank_plugins.utils.op_count import OpCounter

OURS = ("FastAP", "mAP_Q", "RankedList")
PML_OF = {"FastAP": "PML FastAP", "mAP_Q": "PML FastAP", "RankedList": "PML RankedList"}


def one_call(loss_fn, x: torch.Tensor, labels: torch.Tensor) -> float:
    """Seconds of one forward + backward on a fresh leaf copy of ``x``."""
    leaf = x.detach().clone().requires_grad_(True)
    start = time.perf_counter()
    loss_fn(leaf, labels).backward()
    return time.perf_counter() - start


def measure_round(loss_fn, backend: str | None, x, labels, repeats: int, warmup: int) -> float:
    """Median microseconds per call over ``repeats`` calls (after ``warmup`` untimed ones)."""
    with backend_context(backend):
        for _ in range(warmup):
            one_call(loss_fn, x, labels)
        return statistics.median(one_call(loss_fn, x, labels) for _ in range(repeats)) * 1e6


def count_ops(loss_fn, backend: str | None, x, labels) -> tuple[int, int]:
    """``(aten operators, syncing operators)`` of one forward + backward."""
    leaf = x.detach().clone().requires_grad_(True)
    with backend_context(backend), OpCounter() as ops:
        loss_fn(leaf, labels).backward()
    return ops.total, ops.syncs


def cases(backends: list[str]) -> list[tuple[str, str | None]]:
    """``(loss, backend)`` pairs: ours under each backend, then PML's (no backend)."""
    ours = [(name, backend) for name in OURS for backend in backends]
    return ours + [("PML FastAP", None), ("PML RankedList", None)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="embeddings per call (default 8)")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per round")
    parser.add_argument(
        "--backends", type=backend_list, default=["cpu", "gpu"], help="e.g. cpu,gpu,triton"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measures every case, prints the Markdown table; returns 0."""
    args = parse_args(argv)
    if min(args.n, args.repeats, args.rounds) < 1:
        raise SystemExit("bench_host_overhead.py: --n, --repeats and --rounds must be >= 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # host cost of one driving thread, not of intra-op parallelism
    try:
        rows = run(args)
    finally:
        torch.set_num_threads(threads)
    print(
        f"Host time per forward + backward (median us, best of {args.rounds} rounds x "
        f"{args.repeats} calls), CPU, one torch thread, N={args.n}, d={args.dim}"
    )
    print("| loss | backend | host us | PML / case | aten ops | syncing ops |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    by_name = {(row["loss"], row["backend"]): row for row in rows}
    for row in rows:
        pml = by_name[(PML_OF.get(row["loss"], row["loss"]), "-")]
        row["pml_over_case"] = pml["host_us"] / row["host_us"]
        cells = [row["loss"], row["backend"], f"{row['host_us']:.0f}"]
        cells += [f"{row['pml_over_case']:.2f}x", row["ops"], row["syncs"]]
        print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)
    print("expected host time on a GPU: about ops x 10 us plus the Python measured here")
    if args.json:
        payload = {"n": args.n, "dim": args.dim, "repeats": args.repeats, "rounds": args.rounds}
        Path(args.json).write_text(json.dumps({**payload, "rows": rows}, indent=1) + "\n")
    return 0


def run(args: argparse.Namespace) -> list[dict]:
    """The rows, one per case, in :func:`cases` order."""
    x, labels = inputs(args.n, args.dim, "cpu")
    todo = cases(args.backends)
    losses = {case: make_loss(case[0], None) for case in todo}
    best = {case: float("inf") for case in todo}
    for _ in range(args.rounds):
        for case in todo:  # interleaved: a load that comes and goes slows every case alike
            took = measure_round(losses[case], case[1], x, labels, args.repeats, args.warmup)
            best[case] = min(best[case], took)
    rows = []
    for case in todo:
        ops, syncs = count_ops(losses[case], case[1], x, labels)
        rows.append(
            {
                "loss": case[0],
                "backend": case[1] or "-",
                "host_us": best[case],
                "ops": ops,
                "syncs": syncs,
            }
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
