"""Memory-bank scale: a batch ranked against a CrossBatchMemory queue, FastAP / mAP_Q / RLL vs floor.

One training step = forward + backward of a batch of ``--batch`` embeddings (d = ``--dim``)
ranked against a full memory of ``--memory`` embeddings (``pml_rank_plugins.losses.
CrossBatchMemory``, pre-filled with random embeddings, 4 per class; the batch's labels are
memory classes). Each case runs in a fresh subprocess (shared harness
``benchmarks/_measure.py``): ``--warmup`` untimed steps, the best of ``--repeats`` timed steps,
peak memory growth over the pre-call value (CPU: RSS; CUDA: ``torch.cuda.max_memory_allocated``);
``--rounds`` interleaved rounds keep each case's best time and largest peak. ``--device``:
``auto`` (default) runs on CUDA when a GPU is present, else on the CPU. Cases:

* ``fastap`` / ``qap`` / ``rll`` -- ``CrossBatchMemory(FastAPLoss(num_bins=10) |
  QuantizedAPLoss(num_bins=20) | RankedListLoss())``, the way a user trains with a memory: the
  self-index path (the loss gets the memory as ``ref_emb`` and each query's memory slot as
  ``self_index``; no index tuple);
* ``fastap_ref`` / ``qap_ref`` / ``rll_ref`` -- the same losses called directly with
  ``ref_emb=memory, ref_labels=memory_labels``: the losses' own cost;
* ``fastap_pml`` / ``qap_pml`` / ``rll_pml`` -- the same memory through PML's
  ``CrossBatchMemory.forward`` (the path before issue 23, still taken for PML's losses, other
  miners and an extra ``indices_tuple``): an int64 ``indices_tuple`` of every (query, memory)
  pair minus the query's own slot, which the losses turn into pair categories;
* ``floor`` -- ``S = Q @ R.T; (S * S).sum().backward()`` with only ``Q`` (the batch) requiring
  gradient, as the memory is detached.

Columns: ``vs ref`` is a memory-bank case's time over the direct call's (``_ref``), ``peak vs
ref`` the same for the peak. Targets (issue 23; memory 65,536, batch 256, d = 128): through
``CrossBatchMemory`` each loss <= 1.5x the floor and within 10% of the direct call, peak <= 1.2x
the direct call's. ``--autocast bfloat16`` runs the forward under ``torch.autocast`` (one table per dtype given),
``--json PATH`` writes the results, ``--in-process`` measures every case in this process
(``benchmarks/_measure.py``). Run: ``python benchmarks/bench_memory_bank.py [--memory 65536]
[--batch 256] [--device auto|cpu|cuda] [--paired] [--autocast none bfloat16] [--json PATH]
[--in-process]``. ``--paired`` adds a table timed in one process per loss,
the floor, ``CrossBatchMemory``, direct and PML-path steps called in turn each round: on a shared
machine a change of load then hits the four alike, so their ratios hold better than across
subprocesses; the order rotates by one case per round (use ``--repeats`` a multiple of 4).
"""

from __future__ import annotations

import time

import torch
from _backend_report import (
    COUNT_COLUMNS,
    count_cells,
    milliseconds,
    peak_mib,
    print_table_header,
)
from _backends import add_backend_flags, backend_context, check_deadline, split_case
from _measure import (
    AUTOCAST,
    DEVICES,
    PEAK_NAMES,
    add_device_flags,
    add_timing_flags,
    bench_main,
    bench_parser,
    device_label,
    measure_cases,
    measure_in_child,
    mib,
    print_failures,
    print_header,
    print_row,
    product_floor,
    ratio,
    resolve_device,
    seconds,
    time_backward,
    times_cell,
    under_autocast,
    write_json,
)
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss

LOSSES = ["fastap", "qap", "rll"]
CASES = ["floor"] + LOSSES + [f"{name}_ref" for name in LOSSES] + [f"{name}_pml" for name in LOSSES]
# The child gets integers only (``_measure.bench_main``): device and autocast travel as codes
# (indices into ``_measure.DEVICES`` / ``_measure.AUTOCAST``).


def _make_loss(name: str):
    if name == "fastap":
        return FastAPLoss(num_bins=10)
    if name == "qap":
        return QuantizedAPLoss(num_bins=20)
    return RankedListLoss()


def make_compute(case: str, x, labels, mem, mem_labels):
    """The loss (or floor) of ``case`` as a zero-argument callable; memory-bank cases get their
    own full ``CrossBatchMemory`` (a copy of ``mem``)."""
    if case == "floor":
        return product_floor(x, mem)
    if case.endswith("_ref"):
        loss_fn = _make_loss(case[: -len("_ref")])
        return lambda: loss_fn(x, labels, ref_emb=mem, ref_labels=mem_labels)
    name = case.removesuffix("_pml")
    loss_fn = CrossBatchMemory(_make_loss(name), embedding_size=x.shape[1], memory_size=len(mem))
    loss_fn.embedding_memory = mem.clone()
    loss_fn.label_memory = mem_labels.clone()
    loss_fn.has_been_filled = True
    if case.endswith("_pml"):  # PML's forward: the indices_tuple of all pairs
        return lambda: PMLCrossBatchMemory.forward(loss_fn, x, labels)
    return lambda: loss_fn(x, labels)


def paired_times(x, computes: dict, warmup: int, repeats: int) -> dict:
    """Best wall time of each of ``computes`` (forward + backward), the cases called in turn
    within each of ``warmup + repeats`` rounds, so a change of load hits them all alike.

    The order is rotated by one case each round (timed round ``k`` starts with case ``k mod
    K``), so with ``repeats`` a multiple of the ``K`` cases each case is timed equally often in
    each position. A fixed order biased the ratios: with the floor always first and
    ``CrossBatchMemory`` always second, RankedList through ``CrossBatchMemory`` measured
    1.19-1.21x the direct call, and 0.92-1.00x in four runs once the order rotated
    (docs/performance.md).
    """
    best = {case: float("inf") for case in computes}
    cases = list(computes)
    for round_index in range(warmup + repeats):
        shift = (round_index - warmup) % len(cases)
        for case in cases[shift:] + cases[:shift]:
            compute = computes[case]
            x.grad = None
            start = time.perf_counter()
            compute().backward()
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            if round_index >= warmup:
                best[case] = min(best[case], time.perf_counter() - start)
    return best


def run_case(
    case: str,
    memory: int,
    batch: int,
    dim: int,
    device_code: int,
    autocast_code: int,
    warmup: int,
    repeats: int,
    threads,
):
    """Runs inside the subprocess: returns best time (s) and peak memory growth (bytes); a
    ``paired_<loss>`` case returns the paired times of floor, ``<loss>``, ``_ref`` and ``_pml``
    under ``"times"``. The forward runs under ``AUTOCAST[autocast_code]``; a case
    ``"NAME@BACKEND"`` runs under ``use_backend(BACKEND)``; ``--budget-s`` run out:
    ``_backends.CaseSkipped``."""
    check_deadline()
    case, backend = split_case(case)
    device = torch.device(DEVICES[device_code])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    mem = torch.randn(memory, dim).to(device)
    mem_labels = (torch.arange(memory) // 4).to(device)
    x = torch.randn(batch, dim).to(device).requires_grad_(True)
    labels = mem_labels[torch.randint(0, memory, (batch,)).to(device)]
    if case.startswith("paired_"):
        name = case.removeprefix("paired_")
        cases = ["floor", name, f"{name}_ref", f"{name}_pml"]
        autocast = AUTOCAST[autocast_code]
        computes = {
            c: under_autocast(make_compute(c, x, labels, mem, mem_labels), device, autocast)
            for c in cases
        }
        return {"time": 0.0, "peak": 0, "times": paired_times(x, computes, warmup, repeats)}
    compute = make_compute(case, x, labels, mem, mem_labels)
    with backend_context(backend):
        return time_backward(
            x, under_autocast(compute, device, AUTOCAST[autocast_code]), warmup, repeats
        )


def report(args) -> None:
    """Measures every case, prints one table per ``--autocast`` dtype (``--json``: the results)."""
    device = resolve_device(args.device, __file__)
    pairs = args.batch * args.memory
    tables = []
    for autocast in args.autocast:
        peak = PEAK_NAMES[device] if not args.in_process or device == "cuda" else "not measured"
        print(
            f"Memory bank: batch {args.batch} vs memory {args.memory}, d={args.dim}, "
            f"{device_label(device, args.threads, autocast)}, {args.warmup} warm-up step(s), best "
            f"of {args.repeats} timed x {args.rounds} rounds; peak = {peak} during all steps"
        )
        numbers = [args.memory, args.batch, args.dim]
        numbers += [DEVICES.index(device), AUTOCAST.index(autocast)]
        if args.backends:
            best = report_backends(args, device, numbers)
            tables.append({"autocast": autocast, "cases": best})
            continue
        best = measure_cases(__file__, CASES, numbers, args)
        floor = best["floor"]
        print_header(
            ["case", "s / step", "vs floor", "vs ref", "peak MiB", "peak vs ref", "bytes / pair"]
        )
        for case in CASES:
            r = best[case]
            ref = (
                best.get(case.removesuffix("_pml") + "_ref")
                if case in LOSSES or case.endswith("_pml")
                else None
            )
            per_pair = ratio(r, {"peak": pairs}, "peak")
            print_row(
                [
                    case,
                    seconds(r),
                    times_cell(ratio(r, floor), 2),
                    "-" if ref is None else times_cell(ratio(r, ref), 2),
                    mib(r),
                    "-" if ref is None else times_cell(ratio(r, ref, "peak"), 2),
                    "-" if per_pair is None else f"{per_pair:.1f}",
                ]
            )
        print_failures([{"n": args.memory, "cases": best}])
        if args.paired:
            report_paired(args, numbers)
        tables.append({"autocast": autocast, "cases": best})
    write_json(
        args.json,
        {
            "script": "bench_memory_bank.py",
            "device": device,
            "device_name": device_label(device, args.threads),
            "memory": args.memory,
            "batch": args.batch,
            "dim": args.dim,
            "timing": {"warmup": args.warmup, "repeats": args.repeats, "rounds": args.rounds},
            "in_process": args.in_process,
            "backends": args.backends,
            "tables": tables,
        },
    )


def backend_cases(backends: list[str]) -> list[str]:
    """``--backends``: the floor, then every memory-bank, direct and PML-path case under each
    backend (``"fastap@gpu"``, ...)."""
    return ["floor"] + [f"{case}@{b}" for b in backends for case in CASES if case != "floor"]


def report_backends(args, device: str, numbers: list[int]) -> dict:
    """``--backends``: measures :func:`backend_cases` and prints one row per case and backend,
    with the per-call counts (CUDA: kernels, syncs, device-to-host copies; CPU: aten operators,
    syncing ones), then the skipped and failed cases. Returns the results."""
    best = measure_cases(__file__, backend_cases(args.backends), numbers, args)
    pairs = args.batch * args.memory
    columns = ["case", "backend", "ms / step", "vs floor", "vs ref", "peak MiB", "peak vs ref"]
    print_table_header(columns + ["bytes / pair", *COUNT_COLUMNS[device]], text_columns={0, 1})
    for case, r in best.items():
        name, backend = split_case(case)
        ref = None
        if name in LOSSES or name.endswith("_pml"):
            ref = best.get(f"{name.removesuffix('_pml')}_ref@{backend}")
        per_pair = ratio(r, {"peak": pairs}, "peak")
        print_row(
            [
                name,
                backend or "-",
                milliseconds(r),
                times_cell(ratio(r, best["floor"]), 2),
                "-" if ref is None else times_cell(ratio(r, ref), 2),
                peak_mib(r),
                "-" if ref is None else times_cell(ratio(r, ref, "peak"), 2),
                "-" if per_pair is None else f"{per_pair:.1f}",
                *count_cells(r, device),
            ]
        )
    print_failures([{"n": args.memory, "cases": best}])
    return best


def report_paired(args, numbers: list[int]) -> None:
    """``--paired``: per loss, one process calls floor, CrossBatchMemory, direct and PML's path in
    turn, ``--warmup`` + ``--repeats`` rounds; prints the best times and their ratios."""
    print(
        "\nPaired (one process per loss, the four cases called in turn each round, the order "
        f"rotated by one case per round, best of {args.repeats} rounds after {args.warmup} "
        "warm-up round(s)):"
    )
    print_header(["loss", "floor s", "CBM s", "ref s", "PML path s", "CBM / floor", "CBM / ref"])
    for name in LOSSES:
        times = measure_in_child(__file__, f"paired_{name}", numbers, args)["times"]
        floor, cbm, ref = times["floor"], times[name], times[f"{name}_ref"]
        print_row(
            [
                name,
                f"{floor:.3f}",
                f"{cbm:.3f}",
                f"{ref:.3f}",
                f"{times[f'{name}_pml']:.3f}",
                f"{cbm / floor:.2f}x",
                f"{cbm / ref:.2f}x",
            ]
        )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--memory", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    add_device_flags(parser, default_device="auto")
    parser.add_argument(
        "--paired",
        action="store_true",
        help="also time the cases of each loss in turn within one process (robust to load)",
    )
    add_timing_flags(parser)
    add_backend_flags(parser)
    bench_main(parser, run_case, report)


if __name__ == "__main__":
    main()
