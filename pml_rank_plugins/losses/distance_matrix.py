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
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    l2_normalizing = distance.normalize_embeddings and getattr(distance, "p", None) == 2
    if type(distance) is not LpDistance or distance.p != 2 or distance.power != 1:
        if l2_normalizing:
            # Pre-normalize overflow-safe (the distance's own F.normalize then leaves unit rows
            # unchanged and zero rows zero, their gradient zeroed by normalize_rows).
            embeddings = normalize_rows(embeddings)
            gallery = embeddings if is_self else normalize_rows(gallery)
            gallery = gallery if gallery_gradient else gallery.detach()
        return distance(embeddings, gallery)
    distance.reset_stats()
    distance.check_shapes(embeddings, gallery)
    normalize = normalize_rows if distance.normalize_embeddings else (lambda x: x)
    query = normalize(embeddings)
    if is_self:
        ref = query if gallery_gradient else query.detach()
    else:
        ref = normalize(gallery)
    distance.set_default_stats(embeddings, gallery, query, ref)
    return euclidean_distances(query, ref)
