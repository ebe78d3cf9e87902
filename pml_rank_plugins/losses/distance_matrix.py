"""The ``(N, M)`` matrix of a PML distance object, with a lean path for Euclidean distance."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import BaseDistance, LpDistance

from ..functional.euclidean import euclidean_distances
from ..functional.validation import normalize_rows


def distance_matrix(
    distance: BaseDistance,
    embeddings: torch.Tensor,
    ref_emb: torch.Tensor,
    gallery_gradient: bool = True,
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
    """
    is_self = ref_emb is embeddings
    pair = euclidean_embeddings(distance, embeddings, ref_emb, is_self, gallery_gradient)
    if pair is not None:
        return euclidean_distances(*pair)
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    if distance.normalize_embeddings and getattr(distance, "p", None) == 2:
        # Pre-normalize overflow-safe (the distance's own F.normalize then leaves unit rows
        # unchanged and zero rows zero, their gradient zeroed by normalize_rows).
        embeddings = normalize_rows(embeddings)
        gallery = embeddings if is_self else normalize_rows(gallery)
        gallery = gallery if gallery_gradient else gallery.detach()
    return distance(embeddings, gallery)


def euclidean_embeddings(distance, embeddings, ref_emb, is_self: bool, gallery_gradient: bool):
    """``(queries, refs)`` for the chunked Euclidean kernel, or ``None`` for other distances.

    Only a plain ``LpDistance(p=2, power=1)`` (PML's default for RLL, normalized or not) takes
    the chunked path; subclasses and every other distance object are computed by calling them.
    The embeddings are normalized with the shared
    :func:`~pml_rank_plugins.functional.validation.normalize_rows` when the distance normalizes,
    and the distance's stats recorded, as a PML distance call would. ``refs`` is detached unless
    ``gallery_gradient``; with ``is_self`` it is the normalized batch itself (so gradient through
    it reaches the same rows). Shared by :func:`distance_matrix` (dense matrix) and the chunked
    Ranked List kernels of the loss and the miner.
    """
    if type(distance) is not LpDistance or distance.p != 2 or distance.power != 1:
        return None
    distance.reset_stats()
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    distance.check_shapes(embeddings, gallery)
    # The package's shared normalization (F.normalize's values, no overflow for huge rows, zero
    # gradient for zero rows).
    normalize = normalize_rows if distance.normalize_embeddings else (lambda rows: rows)
    queries = normalize(embeddings)
    if is_self:
        refs = queries if gallery_gradient else queries.detach()
    else:
        refs = normalize(gallery)
    distance.set_default_stats(embeddings, gallery, queries, refs)
    return queries, refs
