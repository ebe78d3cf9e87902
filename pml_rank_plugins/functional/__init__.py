"""Pure tensor functions (torch only, no PML import)."""

from .euclidean import euclidean_distances
from .ranked_list import (
    RankedListTerms,
    masked_softmax,
    mine_non_trivial,
    negative_weights,
    ranked_list_terms,
)
from .validation import check_finite, compute_dtype

__all__ = [
    "check_finite",
    "compute_dtype",
    "euclidean_distances",
    "RankedListTerms",
    "masked_softmax",
    "mine_non_trivial",
    "negative_weights",
    "ranked_list_terms",
]
