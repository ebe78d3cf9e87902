"""``--backends``: the pairwise benchmarks' per-backend table (issue 39).

One row per (N, case, backend): the matmul floor and PML's loss measured in the same run, then
each of our losses under each backend of ``--backends`` (``use_backend``, ``_backends.py``),
with its forward + backward time (CUDA: median of CUDA-event timed calls; CPU: best call), its
ratios to PML and to the floor, its peak memory and, per call, the CUDA kernels launched, host
synchronisations and device-to-host copies (``torch.profiler``) on CUDA or the dispatched aten
operators and syncing ones (``OpCounter``) on the CPU. With ``--cuda-graph`` each backend but
``cpu`` gets a twin row, ``gpu+graph`` / ``triton+graph``: the same loss captured once with
``torch.cuda.make_graphed_callables`` and replayed (``_backends.graphed_step``), measured the same
way; on the CPU those rows are skipped with "needs CUDA". PML is skipped with the memory it would
need where its O(L N^2) / O(N^2) memory would not fit (``_backends.pml_skip_reason``), or above
``--pml-max``; the cpu backend above ``--cpu-backend-max``; a case over ``--time-guard`` or
after ``--budget-s`` is skipped with the reason, a failed case is printed with its traceback, and
the rest go on.
"""

from __future__ import annotations

import argparse

from _backends import NEEDS_CUDA, backend_variants, pml_skip_reason, split_case, split_graph
from _measure import (
    AUTOCAST,
    DEVICES,
    LOAD_NAMES,
    PEAK_NAMES,
    competing_load,
    device_label,
    failed,
    machine_load,
    measure_cases,
    print_failures,
    print_row,
    ratio,
    resolve_device,
    run_header,
    times_cell,
    write_json,
)

COUNT_COLUMNS = {"cuda": ["kernels", "syncs", "DtoH"], "cpu": ["aten ops", "sync ops"]}
COUNT_KEYS = {"cuda": ["kernels", "syncs", "dtoh"], "cpu": ["aten_ops", "sync_ops"]}


def print_table_header(columns: list[str], text_columns: set[int]) -> None:
    """A Markdown table header: the columns at ``text_columns`` (0-based) left-aligned, the
    others right-aligned."""
    print("| " + " | ".join(columns) + " |")
    rules = ["---" if i in text_columns else "---:" for i in range(len(columns))]
    print("| " + " | ".join(rules) + " |")


def milliseconds(result: dict | None) -> str:
    """``result["time"]`` in ms (3 significant digits); ``"skipped"`` / ``"error"``."""
    if result is None or "skipped" in result:
        return "skipped"
    if "error" in result:
        return "error"
    ms = result["time"] * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def peak_mib(result: dict | None) -> str:
    """The peak in MiB (one decimal under 10 MiB); ``"-"`` when not measured."""
    if result is None or result.get("peak") is None:
        return "-"
    value = result["peak"] / 2**20
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def count_cells(result: dict | None, device: str) -> list[str]:
    """The per-call counts of ``result`` (:data:`COUNT_KEYS` of ``device``); ``"-"`` where
    missing."""
    keys = COUNT_KEYS[device]
    if result is None or failed(result):
        return ["-"] * len(keys)
    return [str(result[key]) if result.get(key) is not None else "-" for key in keys]


def memory_versus(result: dict | None, pml: dict | None) -> str:
    """``ours / PML`` peak as ``"1/N"`` (``"-"`` when either is missing)."""
    share = ratio(pml, result, "peak")
    if share is None or share == 0:
        return "-"
    return "<1/1000" if share > 1000 else f"1/{share:.0f}"


def plan_size(n: int, args: argparse.Namespace, device: str, spec: dict) -> tuple[list, dict]:
    """The cases to measure at ``n`` and the ones skipped, ``{case: {"skipped": reason}}``.

    ``spec``: ``{"losses": [case names], "pml_loss": "fastap" | "ranked_list", "num_bins":
    L}``."""
    cases, skipped = ["floor"], {}
    reason = pml_skip_reason(spec["pml_loss"], n, device, spec.get("num_bins", 10))
    if n > args.pml_max:
        reason = f"above --pml-max {args.pml_max}"
    if reason is None:
        cases.append("pml")
    else:
        skipped["pml"] = {"time": None, "peak": None, "skipped": reason}
    for loss in spec["losses"]:
        for backend in backend_variants(args.backends, getattr(args, "cuda_graph", False)):
            case = f"{loss}@{backend}"
            limit = args.cpu_backend_max
            if split_graph(backend)[1] and device != "cuda":
                skipped[case] = {"time": None, "peak": None, "skipped": NEEDS_CUDA}
            elif backend == "cpu" and limit is not None and n > limit:
                skipped[case] = {
                    "time": None,
                    "peak": None,
                    "skipped": f"cpu backend above --cpu-backend-max {limit}",
                }
            else:
                cases.append(case)
    return cases, skipped


def size_rows(n: int, best: dict, spec: dict, device: str, backends: list) -> list[list]:
    """The table rows of size ``n``: floor, PML, then each loss under each backend of
    ``backends`` (:func:`_backends.backend_variants`: graphed twins included)."""
    floor, pml = best.get("floor"), best.get("pml")
    labels = spec["labels"]
    rows = []
    order = ["floor", "pml"]
    order += [f"{loss}@{backend}" for loss in spec["losses"] for backend in backends]
    for case in order:
        result = best.get(case)
        if result is None:
            continue
        name, backend = split_case(case)
        is_ours = name not in ("floor", "pml")
        rows.append(
            [
                n,
                labels.get(name, name),
                backend or "-",
                milliseconds(result),
                times_cell(ratio(pml, result)) if is_ours else "-",
                times_cell(ratio(result, floor), 2) if case != "floor" else "1.00x",
                peak_mib(result),
                memory_versus(result, pml) if is_ours else "-",
                *count_cells(result, device),
            ]
        )
    return rows


def report_backends(script: str, args: argparse.Namespace, title: str, spec: dict) -> None:
    """Measures and prints the per-backend tables of a pairwise script, one per ``--autocast``
    dtype (``title``: a format string with ``{where}`` and ``{peak}``), with the skipped and
    failed cases below each; ``--json``: every result.

    ``spec``: ``{"losses": [...], "labels": {case: label}, "pml_loss": ..., "num_bins": L}``."""
    device = resolve_device(args.device, script)
    columns = ["N", "case", "backend", "ms", "PML / case", "case / floor", "peak MiB"]
    columns += ["case / PML mem", *COUNT_COLUMNS[device]]
    tables = []
    for autocast in args.autocast:
        rows = []
        with competing_load(args.load, args.load_limit):
            where = device_label(device, args.threads, autocast)
            peak = PEAK_NAMES[device] if not args.in_process or device == "cuda" else "not measured"
            print(f"{title.format(where=where, peak=peak)}; {LOAD_NAMES[args.load]}")
            print(f"before: {machine_load()}")
            print_table_header(columns, text_columns={1, 2})
            codes = [DEVICES.index(device), AUTOCAST.index(autocast)]
            for n in args.sizes:
                cases, skipped = plan_size(n, args, device, spec)
                best = measure_cases(script, cases, [n, args.dim, *codes], args)
                best = {**best, **skipped}
                variants = backend_variants(args.backends, getattr(args, "cuda_graph", False))
                for row in size_rows(n, best, spec, device, variants):
                    print_row(row)
                rows.append({"n": n, "cases": best})
        print(f"after: {machine_load()}")
        print_failures(rows)
        tables.append({"autocast": autocast, "sizes": rows})
    counts = "kernels / syncs / DtoH per call (torch.profiler)" if device == "cuda" else None
    print(counts or "aten ops / sync ops per call (OpCounter, the CPU proxy)")
    time = "median of CUDA-event timed calls" if device == "cuda" else "best call"
    header = {**run_header(script, device, args), "backends": args.backends, "time": time}
    header["cuda_graph"] = getattr(args, "cuda_graph", False)
    write_json(args.json, {**header, "tables": tables})
