"""1 vs 2 gloo processes at one global batch: time per step and per-process peak memory.

A ConvEmbedder (32x32 grayscale inputs, 64-d) trained with our FastAPLoss on a global batch of
``--batch`` (1024) items, the way the runner trains under ``torchrun``
(:mod:`pml_rank_plugins.trainers.distributed`): every process holds the global batch, embeds its
``1/R`` slice (DDP model), all-gathers the embeddings with gradient, computes the loss on the
global batch and steps. Four cases:

* ``plain R=1`` / ``plain R=2`` -- an ordinary step, in 1 process or 2 gloo processes;
* ``chunked R=1`` / ``chunked R=2`` -- exact chunked backward with chunks of ``--chunk`` (128)
  items; with 2 processes each one chunks its slice.

Each case runs in fresh subprocesses (2 processes start with ``torch.multiprocessing.spawn`` on
loopback), every process with ``--threads`` (1) intra-op threads. Time: ``--warmup`` untimed steps,
then the best of ``--repeats`` timed steps, the slowest process's time (the steps are synchronized
by the all-gather and DDP's all-reduce). Memory: one step with ``MALLOC_MMAP_THRESHOLD_=65536``,
the largest peak RSS growth of one process over its RSS before the step. Cases are measured
``--rounds`` times, interleaved, keeping the best time and the largest peak.
``--smoke`` (every case once in the script's own process, ``benchmarks/_measure.py``) with
``--threads 1`` forks the 2 processes of a case from the script's process instead, after its
1-process cases (:data:`SMOKE_ORDER`): they start with torch imported and warmed up instead of as
two fresh interpreters (about 15 s of CPU less). One thread per process is the condition: a fork
does not carry OpenMP's worker threads, which a rank with more threads would wait for; other
``--threads`` spawn the processes as a full run does.
Run: ``python benchmarks/bench_distributed.py``. On a machine with fewer free cores than
processes the 2-process times measure contention, not scaling: report the core count.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _measure import (
    LOW_MMAP_THRESHOLD,
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
from pml_rank_plugins.trainers import all_gather_with_grad, chunked_backward
from pml_rank_plugins.trainers.distributed import local_slice

CASES = ["plain R=1", "plain R=2", "chunked R=1", "chunked R=2"]
# --smoke --threads 1: the order the cases run in, 1-process cases first (see the docstring)
SMOKE_ORDER = ["plain R=1", "chunked R=1", "plain R=2", "chunked R=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world: int, port: int, kind: str, numbers: list, out: str) -> None:
    """One process of a case: build, warm up, time; writes ``{"time", "peak"}`` to ``out.rank``."""
    batch, chunk, warmup, repeats, threads = numbers
    torch.set_num_threads(threads)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    try:
        torch.manual_seed(0)
        model = ConvEmbedder(in_channels=1, embedding_dim=64)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        loss_fn = FastAPLoss()
        x = torch.rand(batch, 1, 32, 32)  # the global batch, the same in every process
        y = torch.arange(batch) // 4
        part = local_slice(batch)

        def step():
            optimizer.zero_grad()
            if kind == "chunked":
                chunked_backward(net, x[part], y[part], loss_fn, chunk)
            else:
                loss_fn(all_gather_with_grad(net(x[part])), y).backward()
            optimizer.step()

        result = time_calls(step, warmup, repeats)
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        if world > 1:
            dist.destroy_process_group()


def run_case(case: str, *numbers: int, start_method: str = "spawn") -> dict:
    """All processes of one case; the slowest time and the largest per-process peak.

    Args:
        case: ``"plain R=1"``, ``"chunked R=2"``, ...
        numbers: batch, chunk, warmup, repeats, threads.
        start_method: how the processes of a 2-process case start (``"fork"``: only where no
            thread pool is in use, as ``--smoke --threads 1``).
    """
    kind, world = case.split(" R=")
    world = int(world)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        if world == 1:
            run_rank(0, 1, 0, kind, numbers, out)
        else:
            rank_args = (world, _free_port(), kind, numbers, out)
            mp.start_processes(
                run_rank, rank_args, nprocs=world, join=True, start_method=start_method
            )
        results = []
        for rank in range(world):
            with open(f"{out}.{rank}") as f:
                results.append(json.load(f))
    return {
        "time": max(r["time"] for r in results),
        "peak": max(r["peak"] for r in results),
    }


def report(args) -> None:
    """Measures every case, prints the table and the 2-process / 1-process ratios."""
    fork = args.smoke and args.threads == 1
    if fork:  # the ranks fork from this process (see the module docstring)
        args.run_case = partial(run_case, start_method="fork")
    results = measure_cases(
        __file__,
        SMOKE_ORDER if fork else CASES,
        [args.batch, args.chunk],
        args,
        memory_pass=not args.single_pass,  # smoke runs: time and memory from one subprocess
        env_extra=LOW_MMAP_THRESHOLD if args.single_pass else None,
    )
    print(
        f"ConvEmbedder + FastAPLoss, 32x32 inputs, global batch {args.batch}, chunk {args.chunk}, "
        f"CPU gloo, {args.threads} thread(s) per process, {os.cpu_count()} CPU cores visible, "
        f"{args.warmup} warm-up step(s), best of {args.repeats} timed x {args.rounds} rounds; "
        "peak = largest per-process RSS growth during one step"
    )
    print_header(
        ["case", "processes", "items embedded per process", "s per step", "peak MiB per process"]
    )
    for case in CASES:
        world = int(case.split("R=")[1])
        r = results[case]
        print_row([case, world, args.batch // world, f"{r['time']:.2f}", mib(r)])
    for kind in ("plain", "chunked"):
        one, two = results[f"{kind} R=1"], results[f"{kind} R=2"]
        print(
            f"{kind}: 2-process / 1-process time {two['time'] / one['time']:.2f}x, "
            f"peak per process {two['peak'] / max(one['peak'], 1):.2f}x"
        )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", type=int, default=1024, help="global batch")
    parser.add_argument("--chunk", type=int, default=128, help="chunk size of the chunked cases")
    add_timing_flags(
        parser, unit="steps", repeats=2, threads=1, threads_help="torch threads per process"
    )
    parser.add_argument(
        "--single-pass",
        action="store_true",
        help="time and memory from one subprocess per case (quick checks; times are slower)",
    )
    bench_main(parser, run_case, report)


if __name__ == "__main__":
    sys.exit(main())
