"""The ``knn`` part of ``scripts/gpu_check.py``: the k-NN search inside PML's
``AccuracyCalculator``, as evaluation builds it (``experiment.accuracy.make_accuracy_calculator``).

``python scripts/gpu_check_knn.py knn --device cuda|cpu --out DIR``: 400 L2-normalised
embeddings of 20 noisy classes on the device; the metrics of the calculator evaluation uses
(faiss-gpu when installed and the device is CUDA, else faiss-cpu, else PML's ``CustomKNN``:
``experiment.accuracy.knn_backend``) must equal those of PML's exact torch search. The report
names the backend that ran, so a CUDA run without faiss-gpu says it checked the CPU path.
"""

from __future__ import annotations

import torch
from gpu_check_parts import done, fail, part_main

from pml_rank_plugins.experiment.accuracy import (
    faiss_available,
    faiss_gpu_count,
    knn_backend,
    make_accuracy_calculator,
)

TOLERANCE = 1e-6


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
    exact = make_accuracy_calculator(device=device, use_faiss=False).get_accuracy(emb, labels)
    worst = max(abs(got[key] - exact[key]) for key in exact)
    path = backend if backend == "faiss-gpu" else f"{backend} (the CPU path: faiss-gpu not used)"
    details = {"backend": backend, "metrics": got, "max_abs_difference_to_exact": worst}
    lines = [
        f"- k-NN backend: {path}",
        f"- metrics vs PML's exact CustomKNN: max |diff| {worst:.1e}",
    ]
    if worst > TOLERANCE:
        return fail(
            f"{backend} metrics differ from the exact search by {worst:.2e}", details, lines
        )
    return done("pass", None, details, lines)


if __name__ == "__main__":
    part_main({"knn": part_knn})
