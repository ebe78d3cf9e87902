"""The one dispatch point of the soft-histogram kernel: ``cpu``, ``gpu`` or ``triton``.

* ``cpu``: :func:`pml_rank_plugins.functional.histogram.cpu.pair_histograms`, unchanged (its
  results are bit-identical to earlier releases).
* ``gpu``: :func:`.gpu.pair_histograms`, sync-free, chunked from a fixed memory budget.
* ``triton``: :func:`.triton_kernel.triton_pair_histograms`, the fused tiled kernel, which takes
  the categories as labels (``LabelCategories``: its ``labels``, ``ref_labels``,
  ``self_columns``) or as a dense ``(N, M)`` int8 tensor (``DenseCategories``, a miner's pairs).
  It tiles internally: ``chunk_size`` does not apply to it.

Which backend runs is decided by the caller with
:func:`pml_rank_plugins.functional.backend.resolve_backend` (keyword > ``use_backend`` >
``$PML_RANK_BACKEND`` > by device); ``backend=None`` resolves it here from the queries' device.
"""

from __future__ import annotations

import torch

from ..backend import resolve_backend
from ..chunking import DenseCategories, LabelCategories
from . import cpu, gpu, triton_kernel

_RESOLVED = frozenset({"cpu", "gpu", "triton"})


def pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    categories,
    offset: float,
    scale: float,
    num_intervals: int,
    chunk_size: int | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``(N, 2, num_intervals + 1)`` positive/negative soft histograms of
    ``offset + scale * queries @ refs.T`` (see :mod:`pml_rank_plugins.functional.histogram.cpu`)
    computed by ``backend``.

    Args:
        queries, refs, categories, offset, scale, num_intervals, chunk_size: as
            :func:`pml_rank_plugins.functional.histogram.cpu.pair_histograms` (``categories``:
            an int8 ``(N, M)`` tensor, a ``LabelCategories`` or a ``DenseCategories``).
        backend: ``"cpu"``, ``"gpu"``, ``"triton"``, ``"auto"`` or ``None`` (resolved from the
            queries' device and the selection rule of :mod:`pml_rank_plugins.functional.backend`).

    Raises:
        ValueError: an unknown backend, or ``triton`` where the package cannot be imported.
    """
    # A resolved name (what the losses pass) is used as is: check_backend("triton") looks the
    # package up on disk (importlib.util.find_spec, ~90 us a call); anything else is resolved
    # and checked.
    name = (
        backend
        if backend in _RESOLVED
        else resolve_backend(queries.device, backend, dtype=queries.dtype)
    )
    if name == "cpu":
        return cpu.pair_histograms(
            queries, refs, categories, offset, scale, num_intervals, chunk_size
        )
    if name == "gpu":
        return gpu.pair_histograms(
            queries, refs, categories, offset, scale, num_intervals, chunk_size
        )
    gpu.check_pair_inputs(queries, refs, categories, num_intervals)
    if isinstance(categories, LabelCategories):
        return triton_kernel.triton_pair_histograms(
            queries,
            refs,
            categories.labels,
            categories.ref_labels,
            categories.self_columns,
            float(offset),
            float(scale),
            int(num_intervals),
        )
    dense = categories.categories if isinstance(categories, DenseCategories) else categories
    return triton_kernel.triton_pair_histograms(
        queries,
        refs,
        None,
        None,
        None,
        float(offset),
        float(scale),
        int(num_intervals),
        categories=dense.to(torch.int8),
    )
