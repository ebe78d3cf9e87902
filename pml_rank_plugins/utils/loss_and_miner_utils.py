"""What the losses and the miners both use: pair tuples, pair masks, distance matrices.

* :class:`WeightedPairs`: a PML pair tuple ``(a1, p, a2, n)`` that carries one weight per
  negative pair (output of :class:`~pml_rank_plugins.miners.RankedListMiner`, read by
  :class:`~pml_rank_plugins.losses.RankedListLoss` and kept by
  :class:`~pml_rank_plugins.losses.CrossBatchMemory`).
* :func:`pair_masks`: which reference items enter each query's ranked list, as dense masks.
  Every list-wise loss here ranks, for each query ``i``, the reference items ``j`` with
  ``pos[i, j]`` (relevant) or ``neg[i, j]`` (irrelevant); all other pairs are ignored.
* :func:`distance_matrix`, :func:`euclidean_embeddings`: the ``(N, M)`` matrix of a PML distance
  object, and the inputs of the chunked Euclidean kernels for PML's default ``LpDistance``.
* :func:`check_chunk_size`, :func:`ranked_list_categories`: Ranked List Loss / miner arguments.
* :func:`check_self_index`, :func:`takes_self_index`: the per-query *self index* (the reference
  column that holds the query itself, e.g. its slot in a memory bank), which the losses and the
  miner take instead of an ``indices_tuple`` of all pairs minus the self pairs.
* :func:`memory_contents`: the filled part of a cross-batch memory (the loss and its DDP wrapper).

Everything here knows PML (distance objects, ``lmu.convert_to_pairs``); the pure tensor math
lives in :mod:`pml_rank_plugins.functional`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial

import torch
from pytorch_metric_learning.distances import BaseDistance, LpDistance
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.chunk_threads import one_thread_apply
from ..functional.chunking import LabelCategories
from ..functional.euclidean import euclidean_distances
from ..functional.histogram.cpu import pair_categories
from ..functional.validation import (
    check_int,
    check_label_values,
    check_labels,
    normalize_rows,
    validate_indices_tuple,
)


class WeightedPairs(tuple):
    """``(a1, p, a2, n)`` with ``.weights``: a float tensor aligned with the negative pairs.

    It is a plain 4-tuple to everything in PML (``BaseMiner.output_assertion``,
    ``lmu.convert_to_pairs``, every pair loss), so losses that do not know about ``.weights``
    simply ignore it. ``weights[k]`` is the weight of the pair ``(a2[k], n[k])``.

    Raises ``ValueError`` on mismatched lengths (``len(a1) != len(p)``, or ``a2``, ``n`` and
    ``weights`` not of one length).
    """

    weights: torch.Tensor

    def __new__(cls, a1, p, a2, n, weights: torch.Tensor) -> "WeightedPairs":
        if len(weights) != len(a2) or len(n) != len(a2) or len(a1) != len(p):
            raise ValueError(
                f"mismatched lengths: a1={len(a1)}, p={len(p)}, a2={len(a2)}, n={len(n)}, "
                f"weights={len(weights)} (weights are aligned with the negative pairs (a2, n))"
            )
        obj = super().__new__(cls, (a1, p, a2, n))
        obj.weights = weights
        return obj

    def __reduce__(self):
        return (type(self), (*self, self.weights))

    def __repr__(self) -> str:
        return f"WeightedPairs({tuple.__repr__(self)}, weights={self.weights!r})"


def pair_masks(
    labels: torch.Tensor,
    ref_labels: torch.Tensor,
    indices_tuple=None,
    exclude_self: bool = True,
    self_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(pos, neg)``, two ``(N, M)`` bool masks over (query, reference) pairs.

    * Without ``indices_tuple``: positives are same-label pairs, negatives the rest; when the
      reference set is the batch itself (``exclude_self``) the diagonal (self-pair) is removed.
    * With ``indices_tuple`` from any PML miner (pairs ``(a1, p, a2, n)`` or triplets
      ``(a, p, n)``, converted to pairs as PML does): the list of query ``i`` is restricted to
      its mined positives ``{p : a1 = i}`` and mined negatives ``{n : a2 = i}``. Duplicated pairs
      count once. A query that appears in no mined positive (or negative) pair has no positive
      (or negative) and is skipped by the loss.

    Memory O(N M) bytes for N queries and M reference items.

    Args:
        labels: ``(N,)`` query labels.
        ref_labels: ``(M,)`` reference labels.
        indices_tuple: ``None``, a PML pair tuple ``(a1, p, a2, n)`` or triplet ``(a, p, n)``.
        exclude_self: remove the diagonal (the batch is its own reference set; needs N == M).
        self_index: ``(N,)`` reference column of each query's own copy (checked by
            :func:`check_self_index`), removed from its list; ``None``: nothing removed.

    Raises ``ValueError`` naming the element of a malformed ``indices_tuple`` (negative or
    out-of-range index, non-integer dtype, mismatched lengths): see
    :func:`~pml_rank_plugins.functional.validation.validate_indices_tuple`.
    """
    n, m = len(labels), len(ref_labels)
    if indices_tuple is None:
        pos = labels.view(-1, 1) == ref_labels.view(1, -1)
        neg = ~pos
        if exclude_self:
            if n != m:
                raise ValueError("exclude_self needs as many queries as reference items")
            pos.fill_diagonal_(False)
        if self_index is not None:
            pos[torch.arange(n, device=pos.device), self_index] = False
        return pos, neg
    validate_indices_tuple(indices_tuple, n, m)
    a1, p, a2, ng = lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
    pos = torch.zeros(n, m, dtype=torch.bool, device=labels.device)
    neg = torch.zeros(n, m, dtype=torch.bool, device=labels.device)
    pos[a1, p] = True
    neg[a2, ng] = True
    if exclude_self and n == m:
        pos.fill_diagonal_(False)
        neg.fill_diagonal_(False)
    if self_index is not None:
        rows = torch.arange(n, device=pos.device)
        pos[rows, self_index] = False
        neg[rows, self_index] = False
    return pos, neg


def distance_matrix(
    distance: BaseDistance,
    embeddings: torch.Tensor,
    ref_emb: torch.Tensor,
    gallery_gradient: bool = True,
    normalize_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``distance(embeddings, ref_emb)``, with ``ref_emb`` detached unless ``gallery_gradient``.

    For a plain ``LpDistance(p=2, power=1)`` (PML's default) the matrix is computed with
    :func:`pml_rank_plugins.functional.euclidean.euclidean_distances` on the (optionally
    normalized) embeddings: the same values as ``torch.cdist`` up to rounding, but the backward
    skips the detached gallery side. The distance object's stats are still recorded. Any other
    distance (subclasses included) is called as is.

    L2-normalizing distances normalize with
    :func:`pml_rank_plugins.functional.validation.normalize_rows` (the values of ``F.normalize``,
    but no overflow for huge rows and a zero gradient for zero rows).

    ``ref_emb is embeddings`` means the batch is its own gallery: with ``gallery_gradient=False``
    every row still receives gradient as a query, never as a gallery item. O(N M D).

    Args:
        distance: a PML distance object (not a similarity).
        embeddings: ``(N, D)`` query embeddings.
        ref_emb: ``(M, D)`` gallery embeddings (``embeddings`` itself for the batch).
        gallery_gradient: let gradient flow into the gallery side of every pair.
        normalize_fn: the row normalization of L2-normalizing distances (``None``:
            ``normalize_rows``, on one torch thread for the Euclidean path; the ``gpu`` /
            ``triton`` backends pass the sync-free one of ``functional.sync_free_inputs``).

    Returns:
        The ``(N, M)`` distance matrix.
    """
    is_self = ref_emb is embeddings
    pair = euclidean_embeddings(
        distance, embeddings, ref_emb, is_self, gallery_gradient, normalize_fn
    )
    if pair is not None:
        return euclidean_distances(*pair)
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    if distance.normalize_embeddings and getattr(distance, "p", None) == 2:
        # Pre-normalize overflow-safe (the distance's own F.normalize then leaves unit rows
        # unchanged and zero rows zero, their gradient zeroed by normalize_rows).
        normalize = normalize_rows if normalize_fn is None else normalize_fn
        embeddings = normalize(embeddings)
        gallery = embeddings if is_self else normalize(gallery)
        gallery = gallery if gallery_gradient else gallery.detach()
    return distance(embeddings, gallery)


def euclidean_embeddings(
    distance: BaseDistance,
    embeddings: torch.Tensor,
    ref_emb: torch.Tensor,
    is_self: bool,
    gallery_gradient: bool,
    normalize_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(queries, refs)`` for the chunked Euclidean kernel, or ``None`` for other distances.

    Only a plain ``LpDistance(p=2, power=1)`` (PML's default for RLL, normalized or not) takes
    the chunked path; subclasses and every other distance object are computed by calling them.
    The embeddings are normalized with the shared
    :func:`~pml_rank_plugins.functional.validation.normalize_rows` when the distance normalizes,
    and the distance's stats recorded, as a PML distance call would. ``refs`` is detached unless
    ``gallery_gradient``; with ``is_self`` it is the normalized batch itself (so gradient through
    it reaches the same rows). Shared by :func:`distance_matrix` (dense matrix) and the chunked
    Ranked List kernels of the loss and the miner. O((N + M) D).

    Args:
        distance: a PML distance object.
        embeddings: ``(N, D)`` query embeddings.
        ref_emb: ``(M, D)`` reference embeddings.
        is_self: ``ref_emb`` is the batch itself.
        gallery_gradient: keep ``refs`` attached to the graph.
        normalize_fn: the row normalization (``None``: ``normalize_rows`` on one torch thread;
            the ``cpu`` loss passes the screened one, the ``gpu`` / ``triton`` backends the
            sync-free one: the same values).

    Returns:
        ``(queries, refs)`` of shapes ``(N, D)`` and ``(M, D)``, or ``None``.
    """
    if type(distance) is not LpDistance or distance.p != 2 or distance.power != 1:
        return None
    distance.reset_stats()
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    distance.check_shapes(embeddings, gallery)
    # The package's shared normalization (F.normalize's values, no overflow for huge rows, zero
    # gradient for zero rows), on one torch thread, backward too (chunk_threads.one_thread_apply).
    if not distance.normalize_embeddings:
        normalize = lambda rows: rows  # noqa: E731
    elif normalize_fn is None:
        normalize = partial(one_thread_apply, normalize_rows)
    else:
        normalize = normalize_fn
    queries = normalize(embeddings)
    if is_self:
        refs = queries if gallery_gradient else queries.detach()
    else:
        refs = normalize(gallery)
    distance.set_default_stats(embeddings, gallery, queries, refs)
    return queries, refs


def check_chunk_size(chunk_size) -> int | None:
    """``chunk_size`` (query rows per chunk): ``None`` (automatic) or an integer >= 1.

    Args:
        chunk_size: the value to check (Python or numpy integer, or ``None``).

    Returns:
        ``None`` or the ``int``. Raises ``ValueError`` naming ``chunk_size`` otherwise.
    """
    return None if chunk_size is None else check_int(chunk_size, "chunk_size", minimum=1)


def ranked_list_categories(
    labels: torch.Tensor,
    ref_labels: torch.Tensor,
    indices_tuple,
    is_self: bool,
    self_index: torch.Tensor | None = None,
):
    """Pair categories of the ranked lists (0 positive, 1 negative, 2 ignored).

    Without a miner they are derived per chunk from the labels (nothing N x M stored); with an
    ``indices_tuple`` they are ``N M`` int8 from the mined pairs (:func:`pair_masks`).

    Args:
        labels: ``(N,)`` query labels.
        ref_labels: ``(M,)`` reference labels.
        indices_tuple: ``None`` or a PML pair / triplet tuple.
        is_self: the references are the batch itself (self pairs ignored).
        self_index: ``(N,)`` reference column of each query's own copy, ignored (checked by
            :func:`check_self_index`); ``None``: none.

    Returns:
        A :class:`~pml_rank_plugins.functional.chunking.LabelCategories` or an ``(N, M)`` int8
        tensor.
    """
    if indices_tuple is None:
        self_columns = self_index
        if is_self:
            self_columns = torch.arange(len(labels), device=labels.device)
        return LabelCategories(labels, ref_labels, self_columns)
    pos_mask, neg_mask = pair_masks(
        labels, ref_labels, indices_tuple, exclude_self=is_self, self_index=self_index
    )
    return pair_categories(pos_mask, neg_mask)


def check_self_index(
    self_index,
    labels: torch.Tensor,
    ref_labels: torch.Tensor,
    indices_tuple=None,
    *,
    check_values: bool = True,
) -> torch.Tensor:
    """Checks a per-query self index and returns it as an int64 tensor on the labels' device.

    ``self_index[i]`` is the reference column that holds query ``i`` itself (for
    :class:`~pml_rank_plugins.losses.CrossBatchMemory`: the memory slot the batch was just
    written to). That one pair is left out of query ``i``'s ranked list, exactly as PML's
    ``remove_self_comparisons`` removes it from an ``indices_tuple`` of all pairs; the column
    holds the query, so it must carry the query's label. O(N).

    Args:
        self_index: ``(N,)`` integer tensor, one column in ``[0, M)`` per query.
        labels: ``(N,)`` query labels.
        ref_labels: ``(M,)`` reference labels.
        indices_tuple: must be ``None``: mined pairs already say which pairs a list holds.
        check_values: also check the entries' range and labels (reads them back to the host:
            the ``gpu`` / ``triton`` backends skip it unless asked, see
            :func:`pml_rank_plugins.functional.backend.checks_values`).

    Returns:
        ``self_index`` as int64 on ``labels.device``.

    Raises:
        ValueError: naming ``self_index`` for a non-integer dtype, a shape other than ``(N,)``,
            an entry outside ``[0, M)``, a column whose label differs from the query's, or an
            ``indices_tuple`` given too.
    """
    if indices_tuple is not None:
        raise ValueError(
            "self_index and indices_tuple are exclusive: self_index removes each query's own "
            "column from the lists of all pairs; with mined pairs, leave the self pairs out of "
            "the indices_tuple instead"
        )
    if not isinstance(self_index, torch.Tensor):
        raise ValueError(f"self_index must be a torch.Tensor of column indices, got {self_index!r}")
    if (
        self_index.dtype.is_floating_point
        or self_index.dtype.is_complex
        or (self_index.dtype == torch.bool)
    ):
        raise ValueError(f"self_index must hold integer column indices, got {self_index.dtype}")
    n, m = len(labels), len(ref_labels)
    if tuple(self_index.shape) != (n,):
        raise ValueError(
            f"self_index must have shape ({n},), one column per query, got "
            f"{tuple(self_index.shape)}"
        )
    self_index = self_index.to(device=labels.device, dtype=torch.long)
    if not check_values:
        return self_index
    if n and (int(self_index.min()) < 0 or int(self_index.max()) >= m):
        raise ValueError(
            f"self_index entries must be reference columns in [0, {m}), got the range "
            f"[{int(self_index.min())}, {int(self_index.max())}]"
        )
    if n and not torch.equal(ref_labels[self_index].to(labels.dtype), labels):
        bad = int(torch.nonzero(ref_labels[self_index].to(labels.dtype) != labels)[0])
        raise ValueError(
            f"self_index[{bad}] = {int(self_index[bad])} is not query {bad}'s own column: "
            f"ref_labels there is {ref_labels[self_index[bad]].item()}, the query's label is "
            f"{labels[bad].item()}"
        )
    return self_index


def takes_self_index(*methods) -> bool:
    """Whether every one of ``methods`` accepts a ``self_index`` keyword (the losses' ``forward``
    and ``compute_loss``, the miner's ``forward`` and ``mine``). A subclass that overrides one of
    them without it keeps the indices-tuple path of its caller.

    Args:
        methods: bound methods or functions.

    Returns:
        ``True`` when all of them have a parameter named ``self_index``.
    """
    return all("self_index" in inspect.signature(method).parameters for method in methods)


def check_loss_labels(labels: torch.Tensor | None, ref_labels: torch.Tensor | None) -> None:
    """The label checks every loss of this package runs first: labels given (PML's rule), ref
    labels given with ``ref_emb``, neither a bool mask (:func:`check_labels`), and float labels
    that are class ids (no NaN, inf or fraction: :func:`check_label_values`).

    Raises:
        ValueError: naming the missing or bool argument.
    """
    c_f.labels_required(labels)
    if ref_labels is None:
        raise ValueError("ref_labels are required with ref_emb")
    check_labels(labels, "labels")
    check_labels(ref_labels, "ref_labels")
    # Value checks read float labels back to the host: the GPU backends gate this
    # (backend.checks_values) at merge.
    check_label_values(labels, "labels")
    check_label_values(ref_labels, "ref_labels")


def memory_contents(memory) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embeddings, labels)`` of a PML ``CrossBatchMemory``'s filled slots: the whole queue once
    it has wrapped around, else its first ``queue_idx`` rows. Views, no copy; O(1)."""
    if memory.has_been_filled:
        return memory.embedding_memory, memory.label_memory
    return memory.embedding_memory[: memory.queue_idx], memory.label_memory[: memory.queue_idx]
