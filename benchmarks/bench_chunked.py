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

``--loader-workers K`` (PML's trainers default to 2) draws every step's batch from a
``torch.utils.data.DataLoader`` with ``K`` worker processes instead of a tensor in memory: each
item is "decoded" on a worker (a 3 x 64 x 64 image from its seed, blurred, averaged to grayscale
and pooled to 32 x 32, about as costly per item as decoding a small JPEG), and the timed step
includes waiting for the batch. The workers prefetch the next batches while the step runs, so
they compete with it for the cores, as in real training.
Run: ``python benchmarks/bench_chunked.py [--loader-workers 2]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _measure import (
    add_timing_flags,
    bench_main,
    bench_parser,
    machine_load,
    measure_cases,
    mib,
    print_header,
    print_row,
    time_calls,
)
from torch.utils.data import DataLoader, Dataset

from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.models import ConvEmbedder
from pml_rank_plugins.trainers import chunked_backward

CASES = ["chunked", "plain small", "plain large"]


class DecodedImages(Dataset):
    """``size`` synthetic items, each "decoded" on access: a 3 x 64 x 64 image generated from
    its index, blurred, averaged to grayscale and pooled to 1 x 32 x 32; label ``index // 4``."""

    def __init__(self, size: int):
        self.size = size
        self.blur = torch.full((3, 1, 5, 5), 1 / 25)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(1, 3, 64, 64, generator=generator)
        image = F.conv2d(image, self.blur, padding=2, groups=3).mean(1, keepdim=True)
        return F.avg_pool2d(image, 2)[0], index // 4


def batches(size: int, loader_workers: int):
    """An endless iterator of ``(x, y)`` batches of ``size``: one fixed in-memory batch without
    loader workers, else batches of :class:`DecodedImages` from a DataLoader with that many
    worker processes (kept alive across epochs)."""
    if loader_workers == 0:
        x, y = torch.rand(size, 1, 32, 32), torch.arange(size) // 4
        while True:
            yield x, y
    loader = DataLoader(
        DecodedImages(size), batch_size=size, num_workers=loader_workers, persistent_workers=True
    )
    while True:
        yield from loader


def run_case(
    case: str, batch: int, chunk: int, loader_workers: int, warmup: int, repeats: int
) -> dict:
    """Runs inside the subprocess: returns best time (s) and peak RSS growth (bytes)."""
    torch.manual_seed(0)
    model = ConvEmbedder(in_channels=1, embedding_dim=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = FastAPLoss()
    size = chunk if case == "plain small" else batch
    data = batches(size, loader_workers)

    def step():
        x, y = next(data)
        optimizer.zero_grad()
        if case == "chunked":
            chunked_backward(model, x, y, loss_fn, chunk)
        else:
            loss_fn(model(x), y).backward()
        optimizer.step()

    return time_calls(step, warmup, repeats)


def report(args) -> None:
    """Measures every case, prints the table and the two target ratios."""
    numbers = [args.batch, args.chunk, args.loader_workers]
    before = machine_load()
    results = measure_cases(__file__, CASES, numbers, args, memory_pass=True)
    source = (
        f"DataLoader with {args.loader_workers} worker processes"
        if args.loader_workers
        else "in-memory batch"
    )
    print(
        f"ConvEmbedder + FastAPLoss, 32x32 inputs, batch {args.batch}, chunk {args.chunk}, "
        f"CPU, {source}, {args.warmup} warm-up step(s), best of {args.repeats} timed x "
        f"{args.rounds} rounds; peak = RSS growth during one step; before: {before}; after: "
        f"{machine_load()}"
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
    parser.add_argument(
        "--loader-workers", type=int, default=0, help="DataLoader worker processes (0: none)"
    )
    add_timing_flags(parser, unit="steps", repeats=2, threads=None)
    bench_main(parser, run_case, report)


if __name__ == "__main__":
    main()
