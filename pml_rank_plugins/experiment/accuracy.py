"""Evaluation with PML's ``AccuracyCalculator`` plus Recall@K, with or without faiss.

``RecallAtKAccuracyCalculator`` adds one metric ``recall_at_<K>`` per requested K through PML's
custom-metric mechanism (a ``calculate_<name>`` method listed in ``requires_knn``). Recall@K is the
metric of the FastAP / Ranked List papers: the fraction of queries with at least one same-class
item among their K nearest references (the query itself excluded when it is in the reference
set). Queries whose class has no other item in the reference set are excluded, as PML does for
its other k-NN metrics.
"""

from __future__ import annotations

import importlib
from typing import Iterable, Sequence

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN

DEFAULT_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")


def faiss_available() -> bool:
    """True when ``import faiss`` works now (checked at call time, so tests can hide it)."""
    try:
        importlib.import_module("faiss")
    except ImportError:
        return False
    return True


def faiss_gpu_count() -> int:
    """GPUs faiss can use (``faiss.get_num_gpus()``; 0 for faiss-cpu or without faiss)."""
    if not faiss_available():
        return 0
    faiss = importlib.import_module("faiss")
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def knn_backend(device: torch.device | str | None, faiss_installed: bool, faiss_gpus: int) -> str:
    """Which k-NN search evaluation uses: ``"faiss-gpu"`` (faiss-gpu installed, e.g. ``pip install
    .[gpu]``, and the embeddings on a CUDA device), ``"faiss-cpu"`` (faiss installed),
    ``"CustomKNN"`` (no faiss: PML's exact torch search on ``device``)."""
    device = torch.device(device or "cpu")
    if not faiss_installed:
        return "CustomKNN"
    return "faiss-gpu" if device.type == "cuda" and faiss_gpus > 0 else "faiss-cpu"


def recall_at_k(knn_labels: torch.Tensor, query_labels: torch.Tensor, k: int) -> float:
    """Fraction of queries with >= 1 match among the first ``k`` neighbours.

    knn_labels: (Q, >= k) labels of each query's neighbours, nearest first; query_labels: (Q,).
    O(Q k).
    """
    hits = (knn_labels[:, :k] == query_labels[:, None]).any(dim=1)
    return hits.double().mean().item()


class RecallAtKAccuracyCalculator(AccuracyCalculator):
    """``AccuracyCalculator`` with ``recall_at_<K>`` metrics for every K in ``recall_at_k``.

    The k-NN search retrieves at least ``max(recall_at_k)`` neighbours whatever ``k`` says
    (``k="max_bin_count"`` would otherwise return too few neighbours for large K on small
    classes).
    """

    def __init__(self, recall_at_k: Sequence[int] = (1, 2, 4, 8), **kwargs):
        ks = sorted({int(k) for k in recall_at_k})
        if any(k < 1 for k in ks):
            raise ValueError(f"recall_at_k values must be >= 1, got {list(recall_at_k)}")
        self.recall_ks = ks
        # AccuracyCalculator.__init__ discovers metrics through dir(self): bind them first.
        for k in ks:
            setattr(self, f"calculate_recall_at_{k}", self._make_recall(k))
        super().__init__(**kwargs)

    def _make_recall(self, k: int):
        def calculate(knn_labels, query_labels, not_lone_query_mask, **kwargs):
            mask = not_lone_query_mask
            if not torch.any(mask):
                return float("nan")
            return recall_at_k(knn_labels[mask], query_labels[mask], k)

        return calculate

    def requires_knn(self):
        return super().requires_knn() + [f"recall_at_{k}" for k in self.recall_ks]

    def determine_k(self, bin_counts, num_reference_embeddings, ref_includes_query):
        k = super().determine_k(bin_counts, num_reference_embeddings, ref_includes_query)
        available = num_reference_embeddings - int(ref_includes_query)
        want = max([k] + [x for x in self.recall_ks if self._recall_in_use(x)])
        return min(want, available)

    def _recall_in_use(self, k: int) -> bool:
        return f"recall_at_{k}" in self.get_curr_metrics()


def make_accuracy_calculator(
    metrics: Iterable[str] = DEFAULT_METRICS,
    recall_at_k: Sequence[int] = (1, 2, 4, 8),
    k="max_bin_count",
    device: torch.device | None = None,
    use_faiss: bool | None = None,
) -> RecallAtKAccuracyCalculator:
    """Calculator for ``metrics`` + ``recall_at_<K>``; PML's ``CustomKNN`` when faiss is missing.

    ``use_faiss=None`` picks faiss when it imports; with faiss absent PML's default ``FaissKNN``
    would raise ``NameError``, so cosine-similarity ``CustomKNN`` is used instead (same
    neighbours on L2-normalised embeddings). With faiss-gpu and a CUDA ``device`` the search runs
    on that one GPU (PML's default would spread the index over every visible GPU); see
    ``knn_backend``.
    """
    if use_faiss is None:
        use_faiss = faiss_available()
    include = tuple(metrics) + tuple(f"recall_at_{x}" for x in sorted(set(recall_at_k)))
    kwargs = {}
    if not use_faiss:
        kwargs["knn_func"] = CustomKNN(CosineSimilarity())
        kwargs["kmeans_func"] = _NoKMeans()
    elif knn_backend(device, True, faiss_gpu_count()) == "faiss-gpu":
        from pytorch_metric_learning.utils.inference import FaissKNN

        index = torch.device(device).index
        gpu = index if index is not None else torch.cuda.current_device()
        kwargs["knn_func"] = FaissKNN(reset_before=False, reset_after=False, gpus=[gpu])
    return RecallAtKAccuracyCalculator(
        recall_at_k=recall_at_k,
        include=include,
        k=k,
        device=device if device is not None else torch.device("cpu"),
        **kwargs,
    )


class _NoKMeans:
    """Placeholder so ``AccuracyCalculator`` does not build ``FaissKMeans`` without faiss."""

    def __call__(self, *args, **kwargs):
        raise RuntimeError("NMI/AMI need faiss k-means; install faiss-cpu")


def make_tester(
    accuracy_calculator: AccuracyCalculator,
    tester_cls=GlobalEmbeddingSpaceTester,
    **kwargs,
):
    """A PML tester (``GlobalEmbeddingSpaceTester`` by default) using ``accuracy_calculator``."""
    kwargs.setdefault("dataloader_num_workers", 0)
    return tester_cls(accuracy_calculator=accuracy_calculator, **kwargs)
