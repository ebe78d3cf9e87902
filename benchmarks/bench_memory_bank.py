"""Memory-bank scale: a batch ranked against a CrossBatchMemory queue, FastAP / mAP_Q / RLL vs floor.

One training step = forward + backward of a batch of ``--batch`` embeddings (d = ``--dim``)
ranked against a full memory of ``--memory`` embeddings (``pml_rank_plugins.losses.
CrossBatchMemory``, pre-filled with random embeddings, 4 per class; the batch's labels are
memory classes). Each case runs in a fresh subprocess (shared harness
``benchmarks/_measure.py``): ``--warmup`` untimed steps, the best of ``--repeats`` timed steps,
peak RSS growth over the pre-call RSS; ``--rounds`` interleaved rounds keep each case's best time
and largest peak. Cases:

* ``fastap`` / ``qap`` / ``rll`` -- ``CrossBatchMemory(FastAPLoss(num_bins=10) |
  QuantizedAPLoss(num_bins=20) | RankedListLoss())``, the way a user trains with a memory. PML's
  ``CrossBatchMemory`` hands the loss an ``indices_tuple`` of every (query, memory) pair minus the
  query's own slot (``batch x memory`` int64 indices, built by PML), which our losses turn into
  ``batch x memory`` bytes of pair categories;
* ``fastap_ref`` / ``qap_ref`` / ``rll_ref`` -- the same losses called directly with
  ``ref_emb=memory, ref_labels=memory_labels`` (no indices tuple): the losses' own cost;
* ``floor`` -- ``S = Q @ R.T; (S * S).sum().backward()`` with only ``Q`` (the batch) requiring
  gradient, as the memory is detached.

Target (CPU, 2 threads, memory 65,536, batch 256, d = 128): each loss <= 2x the floor, memory
growth O(batch x memory). Run: ``python benchmarks/bench_memory_bank.py [--memory 65536]
[--batch 256]``.
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
    product_floor,
    time_backward,
)

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss

LOSSES = ["fastap", "qap", "rll"]
CASES = ["floor"] + LOSSES + [f"{name}_ref" for name in LOSSES]


def _make_loss(name: str):
    if name == "fastap":
        return FastAPLoss(num_bins=10)
    if name == "qap":
        return QuantizedAPLoss(num_bins=20)
    return RankedListLoss()


def run_case(case: str, memory: int, batch: int, dim: int, warmup: int, repeats: int, threads):
    """Runs inside the subprocess: returns best time (s) and peak RSS growth (bytes)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    mem = torch.randn(memory, dim)
    mem_labels = torch.arange(memory) // 4
    x = torch.randn(batch, dim, requires_grad=True)
    labels = mem_labels[torch.randint(0, memory, (batch,))]
    if case == "floor":
        compute = product_floor(x, mem)
    elif case.endswith("_ref"):
        loss_fn = _make_loss(case[: -len("_ref")])
        compute = lambda: loss_fn(x, labels, ref_emb=mem, ref_labels=mem_labels)  # noqa: E731
    else:
        loss_fn = CrossBatchMemory(_make_loss(case), embedding_size=dim, memory_size=memory)
        loss_fn.embedding_memory = mem.clone()
        loss_fn.label_memory = mem_labels.clone()
        loss_fn.has_been_filled = True
        compute = lambda: loss_fn(x, labels)  # noqa: E731
    return time_backward(x, compute, warmup, repeats)


def report(args) -> None:
    """Measures every case, prints the table."""
    print(
        f"Memory bank: batch {args.batch} vs memory {args.memory}, d={args.dim}, CPU, "
        f"{args.threads} threads, {args.warmup} warm-up step(s), best of {args.repeats} timed x "
        f"{args.rounds} rounds; peak = RSS growth during all steps"
    )
    best = measure_cases(__file__, CASES, [args.memory, args.batch, args.dim], args)
    floor = best["floor"]
    pairs = args.batch * args.memory
    print_header(["case", "s / step", "vs floor", "peak MiB", "bytes / pair"])
    for case in CASES:
        r = best[case]
        print_row(
            [
                case,
                f"{r['time']:.3f}",
                f"{r['time'] / floor['time']:.2f}x",
                mib(r),
                f"{r['peak'] / pairs:.1f}",
            ]
        )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--memory", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    add_timing_flags(parser)
    bench_main(parser, run_case, report)


if __name__ == "__main__":
    main()
