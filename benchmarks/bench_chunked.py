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

import argparse
import json
from functools import partial

from _measure import LOW_MMAP_THRESHOLD, best_over_rounds, run_json, time_calls


def run_case(case: str, batch: int, chunk: int, warmup: int, repeats: int) -> dict:
    import torch

    from pml_rank_plugins.losses import FastAPLoss
    from pml_rank_plugins.models import ConvEmbedder
    from pml_rank_plugins.trainers import chunked_backward

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


def measure(case: str, args) -> dict:
    child = [__file__, "--child", case, args.batch, args.chunk]
    timing = run_json(child + [args.warmup, args.repeats])
    memory = run_json(child + [0, 1], LOW_MMAP_THRESHOLD)
    return {"time": timing["time"], "peak": memory["peak"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps; best is kept")
    parser.add_argument("--rounds", type=int, default=2, help="subprocess rounds per case")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, *numbers = args.child
        print(json.dumps(run_case(case, *map(int, numbers))))
        return
    cases = ["chunked", "plain small", "plain large"]
    results = best_over_rounds(partial(measure, args=args), cases, args.rounds)
    print(
        f"ConvEmbedder + FastAPLoss, 32x32 inputs, batch {args.batch}, chunk {args.chunk}, "
        f"CPU, {args.warmup} warm-up step(s), best of {args.repeats} timed x {args.rounds} "
        "rounds; peak = RSS growth during one step"
    )
    print("| case | items per step | s per step | peak MiB |")
    print("| --- | ---: | ---: | ---: |")
    for case, items in (
        ("chunked", args.batch),
        ("plain small", args.chunk),
        ("plain large", args.batch),
    ):
        r = results[case]
        print(f"| {case} | {items} | {r['time']:.2f} | {r['peak'] / 2**20:.0f} |")
    mem = results["chunked"]["peak"] / max(results["plain small"]["peak"], 1)
    slow = results["chunked"]["time"] / results["plain large"]["time"]
    print(f"chunked peak / plain small peak: {mem:.2f}x (target <= 1.3x)")
    print(f"chunked time / plain large time: {slow:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
