"""The ``(N, M)`` matrix of a PML distance object, with a lean path for Euclidean distance."""

from __future__ import annotations

import torch
from pytorch_metric_learning.distances import BaseDistance, LpDistance

from ..functional.euclidean import euclidean_distances


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

    ``ref_emb is embeddings`` means the batch is its own gallery: with ``gallery_gradient=False``
    every row still receives gradient as a query, never as a gallery item. O(N M D).
    """
    is_self = ref_emb is embeddings
    gallery = ref_emb if gallery_gradient else ref_emb.detach()
    if type(distance) is not LpDistance or distance.p != 2 or distance.power != 1:
        return distance(embeddings, gallery)
    distance.reset_stats()
    distance.check_shapes(embeddings, gallery)
    query = distance.maybe_normalize(embeddings)
    if is_self:
        ref = query if gallery_gradient else query.detach()
    else:
        ref = distance.maybe_normalize(gallery)
    distance.set_default_stats(embeddings, gallery, query, ref)
    return euclidean_distances(query, ref)
