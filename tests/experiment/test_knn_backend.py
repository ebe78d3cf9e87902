"""Which k-NN search evaluation picks: faiss-gpu, the torch search on a GPU without it, faiss-cpu
or PML's CustomKNN; and the torch search's neighbours equal faiss-cpu's (issue 49, item 4)."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.utils.inference import CustomKNN

from pml_rank_plugins.experiment import accuracy


@pytest.mark.parametrize(
    "device, installed, gpus, want",
    [
        ("cuda:1", True, 2, "faiss-gpu"),
        ("cuda", True, 0, "torch"),  # faiss-cpu with CUDA embeddings: the exact search on the GPU
        ("cpu", True, 2, "faiss-cpu"),  # CPU embeddings stay on the CPU even with faiss-gpu
        ("cpu", True, 0, "faiss-cpu"),
        ("cuda", False, 0, "torch"),
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


needs_faiss = pytest.mark.skipif(
    not accuracy.faiss_available(), reason="the comparison with faiss-cpu needs faiss installed"
)


def _points(n, d, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen)


@needs_faiss
@pytest.mark.parametrize("ref_includes_query", [True, False])
@pytest.mark.parametrize("batch_bytes", [1 << 30, 4 * 97 * 3])  # one batch; batches of 3 rows
def test_torch_knn_finds_faiss_cpus_neighbours(ref_includes_query, batch_bytes):
    from pytorch_metric_learning.utils.inference import FaissKNN

    # Gaussian points: no two distances tie, so the neighbour lists must be identical.
    query = _points(61, 16, 0)
    reference = query if ref_includes_query else _points(97, 16, 1)
    if ref_includes_query:
        reference = torch.cat([query, _points(36, 16, 1)])  # the queries are rows 0..60
    k = 10
    want_d, want_i = FaissKNN(reset_before=True, reset_after=True)(
        query, k, reference, ref_includes_query
    )
    got_d, got_i = accuracy.TorchKNN(batch_bytes)(query, k, reference, ref_includes_query)
    assert got_i.shape == (61, k) and torch.equal(got_i.cpu(), want_i.cpu())
    torch.testing.assert_close(got_d.cpu(), want_d.cpu().to(got_d.dtype), rtol=1e-4, atol=1e-4)
    # and the loop: sorted squared distances to every reference, the self row dropped
    full = torch.cdist(query.double(), reference.double()).pow(2)
    if ref_includes_query:
        full[torch.arange(61), torch.arange(61)] = float("inf")
    torch.testing.assert_close(got_d.double(), full.topk(k, largest=False).values, rtol=1e-4,
                               atol=1e-4)  # fmt: skip


@needs_faiss
def test_torch_knn_in_the_calculator_gives_faiss_cpus_metrics():
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(300) % 15
    emb = torch.randn(15, 24, generator=gen)[labels] + torch.randn(300, 24, generator=gen)
    emb = torch.nn.functional.normalize(emb, dim=1)
    calc = accuracy.make_accuracy_calculator(torch_knn=True)
    assert isinstance(calc.knn_func, accuracy.TorchKNN)
    got = calc.get_accuracy(emb, labels)
    want = accuracy.make_accuracy_calculator(torch_knn=False).get_accuracy(emb, labels)
    assert got.keys() == want.keys() and all(abs(got[m] - want[m]) < 1e-12 for m in want), got


@needs_faiss
@pytest.mark.parametrize("faiss_gpus, want", [(0, "TorchKNN"), (1, "FaissKNN")])
def test_a_cuda_device_without_faiss_gpu_gets_the_torch_search(monkeypatch, faiss_gpus, want):
    monkeypatch.setattr(accuracy, "faiss_gpu_count", lambda: faiss_gpus)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    calc = accuracy.make_accuracy_calculator(device=torch.device("cuda", 0))  # no tensor made
    assert type(calc.knn_func).__name__ == want
    cpu = accuracy.make_accuracy_calculator(device=torch.device("cpu"))
    assert type(cpu.knn_func).__name__ == "FaissKNN"  # faiss-cpu on the CPU, as before


def test_torch_knn_refuses_a_zero_batch():
    with pytest.raises(ValueError, match="batch_bytes must be >= 1"):
        accuracy.TorchKNN(0)
