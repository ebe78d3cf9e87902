"""The ``knn`` part of ``scripts/gpu_check.py``: the k-NN search inside PML's
``AccuracyCalculator``, as evaluation builds it (``experiment.accuracy.make_accuracy_calculator``).

``python scripts/gpu_check_knn.py knn --device cuda|cpu --out DIR``: 400 L2-normalised
embeddings of 20 noisy classes on the device; the metrics of the calculator evaluation uses
(faiss-gpu when installed and the device is CUDA, else faiss-cpu, else PML's ``CustomKNN``:
``experiment.accuracy.knn_backend``) must equal those of PML's exact torch search. The report
names the backend that ran: on CUDA without faiss-gpu that is the exact torch search on the GPU
(``TorchKNN``).

It then times that torch search against faiss-cpu (``IndexFlatL2`` through PML's ``FaissKNN``,
on the host's cores) at Stanford Online Products' test scale: 60,502 x 128 L2-normalised
queries against themselves, k = 12 (SOP's largest class, as ``k="max_bin_count"`` asks) plus the
query itself; with ``--tiny`` 2,000 x 16. The neighbours must agree ties aside: equal sorted
distance lists (``TIE_TOLERANCE``); the share of identical neighbour rows is reported.
"""

from __future__ import annotations

import statistics
import time

import torch
from gpu_check_parts import done, fail, part_main

from pml_rank_plugins.experiment.accuracy import (
    TorchKNN,
    faiss_available,
    faiss_gpu_count,
    knn_backend,
    make_accuracy_calculator,
)

TOLERANCE = 1e-6
SOP_SHAPE, TINY_SHAPE, SOP_K = (60502, 128), (2000, 16), 12
TIE_TOLERANCE = 1e-4  # squared distances of unit vectors are in [0, 4]; float32 rounding ~1e-6


def _seconds(fn, device: torch.device) -> tuple[float, tuple]:
    """Wall seconds of ``fn()`` (the device synchronised around it) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def sop_scale_timing(device: torch.device, tiny: bool) -> tuple[dict, list[str]]:
    """``(details, markdown lines)``: TorchKNN on ``device`` (median of 3 after a warm-up)
    against one faiss-cpu search of the same queries, and whether their neighbours agree."""
    from pytorch_metric_learning.utils.inference import FaissKNN

    n, d = TINY_SHAPE if tiny else SOP_SHAPE
    gen = torch.Generator().manual_seed(1)
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    on_device = emb.to(device)
    search = TorchKNN()
    _seconds(lambda: search(on_device, SOP_K, on_device, True), device)  # warm-up
    runs = [_seconds(lambda: search(on_device, SOP_K, on_device, True), device) for _ in range(3)]
    torch_s = statistics.median(t for t, _ in runs)
    got_d, got_i = (x.cpu() for x in runs[-1][1])
    faiss_s, (want_d, want_i) = _seconds(
        lambda: FaissKNN(reset_before=True, reset_after=True)(emb, SOP_K, emb, True),
        torch.device("cpu"),
    )
    worst = float((got_d.sort(1).values - want_d.cpu().sort(1).values).abs().max())
    same_rows = float((got_i == want_i.cpu()).all(1).double().mean())
    details = {
        "shape": [n, d],
        "k": SOP_K,
        "torch_device": str(device),
        "torch_s": torch_s,
        "faiss_cpu_s": faiss_s,
        "speedup": faiss_s / torch_s,
        "max_abs_distance_difference": worst,
        "identical_neighbour_rows": same_rows,
        "torch_threads": torch.get_num_threads(),
    }
    lines = [
        f"- {n:,} x {d} queries against themselves, k = {SOP_K}: TorchKNN on {device} "
        f"{torch_s * 1e3:.1f} ms (median of 3), faiss-cpu {faiss_s * 1e3:.1f} ms "
        f"({faiss_s / torch_s:.1f}x); sorted distances max |diff| {worst:.1e}, "
        f"identical neighbour rows {same_rows:.4%}",
    ]
    return details, lines


def part_knn(args) -> dict:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch.cuda.is_available() is False")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    backend = knn_backend(device, faiss_available(), faiss_gpu_count())
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(20, 32, generator=gen)
    labels = torch.arange(400) % 20
    emb = centers[labels] + 0.8 * torch.randn(400, 32, generator=gen)
    emb = torch.nn.functional.normalize(emb, dim=1).to(device)
    labels = labels.to(device)
    got = make_accuracy_calculator(device=device).get_accuracy(emb, labels)
    exact = make_accuracy_calculator(device=device, use_faiss=False, torch_knn=False)
    exact = exact.get_accuracy(emb, labels)
    worst = max(abs(got[key] - exact[key]) for key in exact)
    where = {"faiss-gpu": "on the GPU", "torch": f"exact, on {device}"}
    path = f"{backend} ({where.get(backend, 'the CPU path')})"
    details = {"backend": backend, "metrics": got, "max_abs_difference_to_exact": worst}
    lines = [
        f"- k-NN backend: {path}",
        f"- metrics vs PML's exact CustomKNN: max |diff| {worst:.1e}",
    ]
    if worst > TOLERANCE:
        return fail(
            f"{backend} metrics differ from the exact search by {worst:.2e}", details, lines
        )
    if not faiss_available():
        lines.append("- SOP-scale timing against faiss-cpu: skipped, faiss is not installed")
        return done("pass", None, details, lines)
    details["sop_scale"], more = sop_scale_timing(device, args.tiny)
    lines += more
    if details["sop_scale"]["max_abs_distance_difference"] > TIE_TOLERANCE:
        return fail(
            "TorchKNN's neighbours differ from faiss-cpu's beyond ties: sorted distances differ "
            f"by {details['sop_scale']['max_abs_distance_difference']:.2e}",
            details,
            lines,
        )
    return done("pass", None, details, lines)


if __name__ == "__main__":
    part_main({"knn": part_knn})
