"""Helpers shared by the losses and the miners (PML's ``utils/loss_and_miner_utils.py`` role).

Import order of the package: ``functional`` <- ``utils`` <- ``losses`` / ``miners`` <-
``trainers``; ``losses`` and ``miners`` never import each other.
"""

from .loss_and_miner_utils import (
    WeightedPairs,
    check_chunk_size,
    distance_matrix,
    euclidean_embeddings,
    pair_masks,
    ranked_list_categories,
)

__all__ = [
    "WeightedPairs",
    "check_chunk_size",
    "distance_matrix",
    "euclidean_embeddings",
    "pair_masks",
    "ranked_list_categories",
]
