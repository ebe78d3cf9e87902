"""Chunked large-batch step vs plain steps: time per step and peak memory, same run.

A ConvEmbedder (4 conv blocks, 32x32 grayscale inputs, 64-d) trained with our FastAPLoss:

* chunked -- batch ``--batch`` (4096) through ``chunked_backward`` with chunks of ``--chunk`` (128);
* plain small -- an ordinary step on a batch of ``--chunk`` items;
* plain large -- an ordinary step on the full ``--batch``.

Each case runs in its own subprocess: best wall time of ``--repeats`` steps (forward, backward,
optimizer step) and peak RSS growth over the RSS before the first step (``ru_maxrss`` minus the
baseline read from /proc/self/statm; children run with
``MALLOC_MMAP_THRESHOLD_=65536`` so freed blocks go back to the OS). Targets: chunked peak memory within 1.3x of the plain
small step; chunked time <= 1.5x the plain large step.
Run: ``python benchmarks/bench_chunked.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# Without a fixed mmap threshold glibc keeps freed medium-sized blocks in the heap, so RSS would
# report allocator caching rather than live memory; the same setting applies to every case.
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(case: str, batch: int, chunk: int, repeats: int) -> dict:
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
    baseline = _rss_bytes()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.zero_grad()
        if case == "chunked":
            chunked_backward(model, x, y, loss_fn, chunk)
        else:
            loss_fn(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"time": min(times), "peak": max(0, peak - baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, batch, chunk, repeats = args.child
        print(json.dumps(run_case(case, int(batch), int(chunk), int(repeats))))
        return
    results = {}
    for case in ("chunked", "plain small", "plain large"):
        cmd = [sys.executable, __file__, "--child", case, str(args.batch), str(args.chunk)]
        out = subprocess.run(
            cmd + [str(args.repeats)], capture_output=True, text=True, check=True, env=CHILD_ENV
        )
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"ConvEmbedder + FastAPLoss, 32x32 inputs, batch {args.batch}, chunk {args.chunk}, "
        f"CPU, best of {args.repeats} steps; peak = RSS growth"
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
