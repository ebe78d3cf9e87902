"""Chunked large-batch step vs plain steps: time per step and peak memory, same run.

A ConvEmbedder (4 conv blocks, 32x32 grayscale inputs, 64-d) trained with our FastAPLoss:

* chunked -- batch ``--batch`` (4096) through ``chunked_backward`` with chunks of ``--chunk`` (128);
* plain small -- an ordinary step on a batch of ``--chunk`` items;
* plain large -- an ordinary step on the full ``--batch``.

Each case is measured in two fresh subprocesses. Time: default allocator, ``--warmup`` untimed
steps, then the best wall time of ``--repeats`` steps (forward, backward, optimizer step).
Memory: one step with ``MALLOC_MMAP_THRESHOLD_=65536`` (so glibc returns freed blocks to the OS
and RSS tracks live memory), peak RSS growth over the RSS before the step (``ru_maxrss`` minus the
baseline read from /proc/self/statm). The low mmap threshold makes every large allocation fault
its pages in anew, which slows the many per-chunk allocations of the chunked step by about 2x
(measured: 15.3 s vs 7.6-8.0 s per step), so it is kept out of the timing runs. The three cases
are measured ``--rounds`` times, interleaved, keeping each case's best time and largest peak.
Targets: chunked peak memory within 1.3x of the plain small step; chunked time <= 1.5x the plain
large step.
Run: ``python benchmarks/bench_chunked.py``.
"""

from __future__ import annotations

import torch
from _measure import (
    add_timing_flags,
    bench_main,
    bench_parser,
    measure_cases,
    mib,
    print_header,
    print_row,
    time_calls,
)

from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.models import ConvEmbedder
from pml_rank_plugins.trainers import chunked_backward

CASES = ["chunked", "plain small", "plain large"]


def run_case(case: str, batch: int, chunk: int, warmup: int, repeats: int) -> dict:
    """Runs inside the subprocess: returns best time (s) and peak RSS growth (bytes)."""
    torch.manual_seed(0)
    model = ConvEmbedder(in_channels=1, embedding_dim=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = FastAPLoss()
    size = chunk if case == "plain small" else batch
    x = torch.rand(size, 1, 32, 32)
    y = torch.arange(size) // 4

    def step():
        optimizer.zero_grad()
        if case == "chunked":
            chunked_backward(model, x, y, loss_fn, chunk)
        else:
            loss_fn(model(x), y).backward()
        optimizer.step()

    return time_calls(step, warmup, repeats)


def report(args) -> None:
    """Measures every case, prints the table and the two target ratios."""
    numbers = [args.batch, args.chunk]
    results = measure_cases(__file__, CASES, numbers, args, memory_pass=True)
    print(
        f"ConvEmbedder + FastAPLoss, 32x32 inputs, batch {args.batch}, chunk {args.chunk}, "
        f"CPU, {args.warmup} warm-up step(s), best of {args.repeats} timed x {args.rounds} "
        "rounds; peak = RSS growth during one step"
    )
    print_header(["case", "items per step", "s per step", "peak MiB"])
    for case, items in zip(CASES, (args.batch, args.chunk, args.batch)):
        r = results[case]
        print_row([case, items, f"{r['time']:.2f}", mib(r)])
    mem = results["chunked"]["peak"] / max(results["plain small"]["peak"], 1)
    slow = results["chunked"]["time"] / results["plain large"]["time"]
    print(f"chunked peak / plain small peak: {mem:.2f}x (target <= 1.3x)")
    print(f"chunked time / plain large time: {slow:.2f}x (target <= 1.5x)")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=128)
    add_timing_flags(parser, unit="steps", repeats=2, threads=None)
    bench_main(parser, run_case, report)


if __name__ == "__main__":
    main()
