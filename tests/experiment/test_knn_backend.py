"""Which k-NN search evaluation picks: faiss-gpu, faiss-cpu or PML's CustomKNN."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.utils.inference import CustomKNN

from pml_rank_plugins.experiment import accuracy


@pytest.mark.parametrize(
    "device, installed, gpus, want",
    [
        ("cuda:1", True, 2, "faiss-gpu"),
        ("cuda", True, 0, "faiss-cpu"),  # faiss-cpu with CUDA embeddings: searched on the CPU
        ("cpu", True, 2, "faiss-cpu"),  # CPU embeddings stay on the CPU even with faiss-gpu
        ("cuda", False, 0, "CustomKNN"),
        (None, False, 0, "CustomKNN"),
    ],
)
def test_knn_backend_choice(device, installed, gpus, want):
    assert accuracy.knn_backend(device, installed, gpus) == want


def test_without_faiss_the_calculator_uses_custom_knn(monkeypatch):
    monkeypatch.setattr(accuracy, "faiss_available", lambda: False)
    assert accuracy.faiss_gpu_count() == 0
    calc = accuracy.make_accuracy_calculator(device=torch.device("cpu"))
    assert isinstance(calc.knn_func, CustomKNN)
