"""Evaluation with PML's ``AccuracyCalculator`` plus Recall@K, with or without faiss.

``RecallAtKAccuracyCalculator`` adds one metric ``recall_at_<K>`` per requested K through PML's
custom-metric mechanism (a ``calculate_<name>`` method listed in ``requires_knn``). Recall@K is the
metric of the FastAP / Ranked List papers: the fraction of queries with at least one same-class
item among their K nearest references (the query itself excluded when it is in the reference
set). Queries whose class has no other item in the reference set are excluded, as PML does for
its other k-NN metrics.

The k-NN search (:func:`knn_backend`): faiss-gpu where installed and the embeddings are on CUDA;
on a CUDA device without it (faiss-gpu cannot be installed on many GPU machines) the exact,
batched :class:`TorchKNN` on that device, rather than faiss-cpu on the host; faiss-cpu for CPU
embeddings; PML's ``CustomKNN`` without faiss on the CPU.
"""

from __future__ import annotations

import importlib
from typing import Iterable, Sequence

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN, return_results

from ..functional.histogram.gpu import float32_matmul

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
    """Which k-NN search evaluation uses for embeddings on ``device``:

    * ``"faiss-gpu"``: faiss-gpu installed (e.g. ``pip install .[gpu]``) and a CUDA device;
    * ``"torch"``: a CUDA device without faiss-gpu (a CPU build of faiss, or none):
      :class:`TorchKNN`, exact and batched on that GPU, instead of copying the embeddings to
      faiss-cpu on the host;
    * ``"faiss-cpu"``: CPU embeddings with faiss installed;
    * ``"CustomKNN"``: CPU embeddings without faiss (PML's exact torch search, cosine)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return "faiss-gpu" if faiss_installed and faiss_gpus > 0 else "torch"
    return "faiss-cpu" if faiss_installed else "CustomKNN"


class TorchKNN:
    """Exact k-NN by squared Euclidean distance in torch, on the embeddings' device: PML's
    ``knn_func`` interface (``AccuracyCalculator``), the neighbours and distances of faiss's
    ``IndexFlatL2`` (PML's default ``FaissKNN``), ties aside.

    ``d(q, r) = ||q||^2 + ||r||^2 - 2 q.r`` for a batch of queries against every reference
    (one ``addmm``, in IEEE float32 on CUDA whatever the TF32 setting: TF32 would reorder close
    neighbours), then ``topk``. The batch is sized so that its ``(B, M)`` distance block takes
    at most ``batch_bytes`` (default 1 GiB): O(Q M d) time, O(B M + Q k) memory. With
    ``ref_includes_query`` one more neighbour is searched and each query's own row removed
    (PML's ``return_results``, as ``FaissKNN`` does).

    Args:
        batch_bytes: the memory of one batch's distance block.
    """

    def __init__(self, batch_bytes: int = 1 << 30):
        if batch_bytes < 1:
            raise ValueError(f"batch_bytes must be >= 1, got {batch_bytes}")
        self.batch_bytes = int(batch_bytes)

    def __call__(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distances, indices)``, each ``(Q, k)``, nearest first (squared distances)."""
        if ref_includes_query:
            k = k + 1
        dtype = torch.promote_types(query.dtype, torch.float32)
        query, reference = query.to(dtype), reference.to(device=query.device, dtype=dtype)
        rows = max(1, self.batch_bytes // (dtype.itemsize * max(len(reference), 1)))
        ref_sq = reference.pow(2).sum(1)
        distances, indices = [], []
        with torch.no_grad(), float32_matmul(query.device):
            for start in range(0, len(query), rows):
                q = query[start : start + rows]
                # ||r||^2 - 2 q.r, then + ||q||^2 (a constant per row: it changes no order)
                block = torch.addmm(ref_sq.unsqueeze(0), q, reference.T, alpha=-2)
                block += q.pow(2).sum(1, keepdim=True)
                d, i = torch.topk(block, k, dim=1, largest=False)
                distances.append(d.clamp_min_(0))
                indices.append(i)
        return return_results(torch.cat(distances), torch.cat(indices), ref_includes_query)


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
    torch_knn: bool | None = None,
) -> RecallAtKAccuracyCalculator:
    """Calculator for ``metrics`` + ``recall_at_<K>``, its k-NN search chosen by
    ``experiment.accuracy.knn_backend`` for ``device``.

    ``use_faiss=None`` picks faiss when it imports; with faiss absent PML's default ``FaissKNN``
    would raise ``NameError``, so cosine-similarity ``CustomKNN`` is used instead on the CPU
    (same neighbours on L2-normalised embeddings). With faiss-gpu and a CUDA ``device`` the
    search runs on that one GPU (PML's default would spread the index over every visible GPU);
    on a CUDA ``device`` without faiss-gpu, :class:`~pml_rank_plugins.experiment.TorchKNN` runs
    there. ``torch_knn=True`` forces it on any device (how it is tested on the CPU), ``False``
    never uses it.
    """
    if use_faiss is None:
        use_faiss = faiss_available()
    include = tuple(metrics) + tuple(f"recall_at_{x}" for x in sorted(set(recall_at_k)))
    kwargs = {}
    backend = knn_backend(device, use_faiss, faiss_gpu_count() if use_faiss else 0)
    if torch_knn or (torch_knn is None and backend == "torch"):
        kwargs["knn_func"] = TorchKNN()
        if not use_faiss:
            kwargs["kmeans_func"] = _NoKMeans()
    elif not use_faiss:
        kwargs["knn_func"] = CustomKNN(CosineSimilarity())
        kwargs["kmeans_func"] = _NoKMeans()
    elif backend == "faiss-gpu":
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
