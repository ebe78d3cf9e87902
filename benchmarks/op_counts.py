"""CPU proxy of GPU launch overhead: aten operators and syncing operators per forward + backward.

On a GPU a loss made of many small operators is host-bound (one kernel launch each) and every
syncing operator (``nonzero``, boolean indexing, ``item``, ``unique``, ``bincount``, a device-to-
host copy...) stalls the host until the device has caught up. Both can be counted on the CPU, in
CI: ``pml_rank_plugins.utils.op_count.OpCounter`` (a ``TorchDispatchMode``) counts every aten
operator one call dispatches, autograd's backward included, and flags the syncing ones. This
script prints, for each of our losses (FastAP 10 bins, mAP_Q 20 bins, RankedList) under each
backend of ``--backends`` (``use_backend``), and for PML's ``FastAPLoss`` and ``RankedListLoss``,
the operators and syncing operators of one forward + backward at N = ``--n`` (d = ``--dim``, 4
items per class; one uncounted warm-up call at N = 64 first), with the issue's targets beside
the ``gpu`` and ``triton`` rows and PASS / FAIL.

Targets (issue 39, at one chunk: the ``gpu`` backend's automatic chunking gives one chunk at
N = 4096 on any device): 0 syncing operators; <= 100 operators for FastAP and mAP_Q, <= 140 for
RankedList; fewer than PML's own loss in the same count (the issue counted PML FastAP 123 and
PML RankedList 145 operators; this count, which also sees PML's validation, may differ: the
comparison uses the PML rows of the same run). The ``cpu`` backend has no target (its rows are
the reference). PML is counted at N = min(``--n``, ``--pml-n``): its operator count does not
depend on N (no chunks; ``tests/test_benchmarks.py`` checks this at two sizes), while its
O(L N^2) memory would need about 3 GB at N = 4096.

Exit status 0 whatever the verdicts, unless ``--check``: then 1 when a target is missed.
Run: ``python benchmarks/op_counts.py [--n 4096] [--chunk-size K] [--backends cpu,gpu]
[--device cpu|cuda] [--json PATH] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from _backends import backend_context, backend_list
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss
from pytorch_metric_learning.losses import RankedListLoss as PMLRankedListLoss

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.utils.op_count import OpCounter

LOSSES = {"FastAP": "fastap", "mAP_Q": "fastap", "RankedList": "ranked_list"}
OP_BUDGETS = {"FastAP": 100, "mAP_Q": 100, "RankedList": 140}
PML_NAMES = {"fastap": "PML FastAP", "ranked_list": "PML RankedList"}
ISSUE_PML_COUNTS = {"PML FastAP": 123, "PML RankedList": 145}
TARGETED_BACKENDS = ("gpu", "triton")


def make_loss(name: str, chunk_size: int | None):
    """One of our losses (``chunk_size`` passed on) or PML's (``"PML ..."``)."""
    if name == "FastAP":
        return FastAPLoss(num_bins=10, chunk_size=chunk_size)
    if name == "mAP_Q":
        return QuantizedAPLoss(num_bins=20, chunk_size=chunk_size)
    if name == "RankedList":
        return RankedListLoss(margin=0.4, alpha=1.2, Tn=10.0, chunk_size=chunk_size)
    if name == "PML FastAP":
        return PMLFastAPLoss(num_bins=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PML warns for any Tn > 5
        return PMLRankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2)


def inputs(n: int, dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random ``dim``-d embeddings (requiring gradient) and labels, 4 per class."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=generator).to(device).requires_grad_(True)
    return x, (torch.arange(n) // 4).to(device)


def count(loss_fn, n: int, dim: int, device: str, backend: str | None) -> dict:
    """Operators of one forward + backward at ``n`` under ``backend`` (after a warm-up call at
    N = 64): ``{"n", "ops", "syncs", "sync_ops": {name: count}}``."""
    with backend_context(backend):
        x, labels = inputs(64, dim, device)
        loss_fn(x, labels).backward()
        x, labels = inputs(n, dim, device)
        with OpCounter() as ops:
            loss_fn(x, labels).backward()
    return {"n": n, "ops": ops.total, "syncs": ops.syncs, "sync_ops": dict(ops.sync_counts)}


def verdict(name: str, backend: str, row: dict, pml: dict) -> tuple[str, str]:
    """``(target, "PASS" | "FAIL" | "-")`` of one of our rows (targets for gpu / triton only)."""
    if backend not in TARGETED_BACKENDS:
        return "- (reference)", "-"
    budget, pml_ops = OP_BUDGETS[name], pml.get("ops")
    target = f"0 syncs, <= {budget} ops, < PML ({pml_ops if pml_ops is not None else '?'})"
    ok = row["syncs"] == 0 and row["ops"] <= budget
    ok = ok and (pml_ops is None or row["ops"] < pml_ops)
    return target, "PASS" if ok else "FAIL"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="embeddings per call (default 4096)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="our losses' chunk_size (default: automatic)"
    )
    parser.add_argument(
        "--backends", type=backend_list, default=["cpu", "gpu"], help="e.g. cpu,gpu,triton"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--pml-n", type=int, default=512, help="N at most for PML's losses")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Counts, prints the table; returns the exit status (``--check``: 1 on a missed target)."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("op_counts.py: --device cuda, but no CUDA GPU is available")
    pml_n = min(args.n, args.pml_n)
    pml = {
        label: count(make_loss(label, None), pml_n, args.dim, args.device, None)
        for label in PML_NAMES.values()
    }
    chunks = "automatic" if args.chunk_size is None else str(args.chunk_size)
    print(
        f"Aten operators per forward + backward (OpCounter), {args.device}, N={args.n} "
        f"(PML: N={pml_n}), d={args.dim}, chunk_size {chunks}"
    )
    print(
        "| loss | backend | N | aten ops | syncing ops | syncing ops by name | target | verdict |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | --- | --- |")
    rows, misses = [], 0
    for name, family in LOSSES.items():
        for backend in args.backends:
            row = count(make_loss(name, args.chunk_size), args.n, args.dim, args.device, backend)
            target, result = verdict(name, backend, row, pml[PML_NAMES[family]])
            misses += result == "FAIL"
            rows.append({"loss": name, "backend": backend, **row, "verdict": result})
            print_row(name, backend, row, target, result)
    for label, row in pml.items():
        rows.append({"loss": label, "backend": "-", **row, "verdict": "-"})
        print_row(label, "-", row, f"reference (issue: {ISSUE_PML_COUNTS[label]} ops)", "-")
    print(f"{misses} target(s) missed" if misses else "every target met")
    if args.json:
        payload = {"device": args.device, "n": args.n, "pml_n": pml_n, "dim": args.dim}
        payload.update(chunk_size=args.chunk_size, rows=rows, misses=misses)
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 1 if args.check and misses else 0


def print_row(name: str, backend: str, row: dict, target: str, result: str) -> None:
    """One Markdown row."""
    by_name = ", ".join(f"{op} {k}" for op, k in sorted(row["sync_ops"].items())) or "-"
    cells = [name, backend, row["n"], row["ops"], row["syncs"], by_name, target, result]
    print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
