"""Row chunking and pair categories shared by the chunked pairwise kernels.

The histogram kernel (:mod:`~pml_rank_plugins.functional.histogram.cpu`) and the chunked Ranked
List Loss (:mod:`~pml_rank_plugins.functional.ranked_list.cpu`) both process the ``N x M``
(query, reference) pairs one chunk of query rows at a time, in reused buffers, and need each
pair's category: 0 = positive, 1 = negative, 2 = ignored (self pair, unmined pair).

Categories come from a *source* with ``shape``, ``device`` and ``rows(start, stop, out=None)``:
:class:`DenseCategories` wraps an ``(N, M)`` int8 tensor (pairs from a miner, N M bytes);
:class:`LabelCategories` derives each chunk's categories from the labels (same label = positive,
else negative, self pair ignored), so nothing of size N x M is stored.
"""

from __future__ import annotations

import torch

POSITIVE, NEGATIVE, IGNORED = 0, 1, 2
# Default chunking: about 256K scores per chunk keeps the elementwise passes in cache, but the
# chunk's (rows x d) @ (d x M) product gets inefficient below ~128 rows (measured on CPU at
# N = M = 16384: 16 rows 7.6 s, 128 rows 3.2 s), so large M gets 128-row chunks, up to a ceiling
# of 4M scores per chunk (the buffers then take about 21 bytes per score: 84 MB).
CACHE_CHUNK_ELEMENTS = 1 << 18
MIN_CHUNK_ROWS = 128
MAX_CHUNK_ELEMENTS = 1 << 22


# The GPU rule: a fixed memory budget per call, never the free memory (results must not depend
# on what else is allocated): min(2 GiB, 10% of the device's total memory).
GPU_BUDGET_CAP_BYTES = 2 << 30
GPU_BUDGET_FRACTION = 0.10


def gpu_budget_bytes(device: torch.device | str) -> int:
    """Bytes of chunk buffers one kernel call may use under the ``gpu`` rule:
    ``min(2 GiB, 10% of total memory)`` on CUDA, ``2 GiB`` elsewhere (the ``gpu`` backend run on
    CPU, e.g. in CI). Depends only on the device's total memory: the same on every call. The one
    place tests patch to force several chunks."""
    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(min(GPU_BUDGET_CAP_BYTES, GPU_BUDGET_FRACTION * total))
    return GPU_BUDGET_CAP_BYTES


def rows_per_chunk(
    num_rows: int,
    num_cols: int,
    chunk_size: int | None = None,
    *,
    bytes_per_pair: int | None = None,
    device: torch.device | str = "cpu",
) -> int:
    """Query rows per chunk: ``chunk_size`` if given; else, with ``bytes_per_pair`` (the ``gpu``
    rule), as many rows as :func:`gpu_budget_bytes` holds at ``bytes_per_pair * M`` bytes a row;
    else (the ``cpu`` rule) ``max(256K / M, 128)`` rows, at most ``4M / M``. Always in
    ``[1, max(num_rows, 1)]`` except that ``chunk_size`` is returned as given."""
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    num_cols = max(num_cols, 1)
    if bytes_per_pair is not None:
        rows = gpu_budget_bytes(device) // (int(bytes_per_pair) * num_cols)
        return max(1, min(max(num_rows, 1), rows))
    rows = max(CACHE_CHUNK_ELEMENTS // num_cols, MIN_CHUNK_ROWS)
    return max(1, min(num_rows, rows, MAX_CHUNK_ELEMENTS // num_cols))


class DenseCategories:
    """Category source over a precomputed ``(N, M)`` int8 tensor."""

    def __init__(self, categories: torch.Tensor):
        self.categories = categories.to(torch.int8)
        self.shape = tuple(categories.shape)
        self.device = categories.device

    def rows(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``[start, stop)``: a view of the tensor (``out`` is not needed and not used)."""
        return self.categories[start:stop]


class LabelCategories:
    """Categories computed per chunk from labels: 0 where the labels match, 1 where they differ,
    2 at ``self_columns[i]`` (the query's own column when ranking a batch against itself).
    O(chunk * M) per call; nothing of size N x M is stored."""

    def __init__(self, labels: torch.Tensor, ref_labels: torch.Tensor, self_columns=None):
        self.shape = (len(labels), len(ref_labels))
        # Dense int32 ids: comparing 4-byte ids is ~30% faster than comparing int64 labels.
        ids = torch.unique(torch.cat([labels, ref_labels]), return_inverse=True)[1].int()
        self.labels, self.ref_labels = ids[: len(labels)], ids[len(labels) :]
        self.self_columns = self_columns
        self.device = labels.device
        self._buffer = None

    def rows(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``[start, stop)`` computed into ``out`` (an int8 ``(>= stop - start, M)``
        buffer), or without ``out`` into one buffer reused across calls (a fresh multi-MB
        allocation per chunk costs page faults); the returned rows are valid until that buffer is
        reused."""
        labels = self.labels[start:stop]
        if out is None:
            if self._buffer is None or self._buffer.shape[0] < len(labels):
                self._buffer = torch.empty(
                    len(labels), self.shape[1], dtype=torch.int8, device=labels.device
                )
            out = self._buffer
        if out.dtype != torch.int8:
            raise ValueError(f"out must be an int8 buffer, got {out.dtype}")
        categories = out[: len(labels)]
        # The comparison writes its 0/1 bytes through a bool view of the int8 buffer (no
        # conversion pass). The buffer itself must be int8: IGNORED (2) is not a bool value, and
        # a bool copy of such a byte stores True (1, a negative). torch.compile's
        # functionalization makes that copy: the in-place write to the int8 view of a slice
        # becomes index_put on a copy, viewed back as bool and slice_scatter'ed into the bool
        # buffer. With a bool buffer the self pairs became negatives under aot_eager / inductor
        # (issue 48: FastAP 0.914212 instead of 0.902765, RankedList 1.827091 instead of 0.710675
        # on 40 x 32 embeddings).
        torch.ne(labels.view(-1, 1), self.ref_labels.view(1, -1), out=categories.view(torch.bool))
        if self.self_columns is not None:
            local = torch.arange(len(labels), device=labels.device)
            categories[local, self.self_columns[start:stop]] = IGNORED
        return categories
