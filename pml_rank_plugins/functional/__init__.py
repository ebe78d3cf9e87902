"""Pure tensor functions (torch only, no PML import)."""

from .average_precision import ranked_average_precision
from .euclidean import euclidean_distances
from .histogram.cpu import PairHistogram, pair_categories, pair_histograms
from .histogram.reference import exact_average_precision, histogram_ap, tie_aware_histogram_ap
from .ranked_list.reference import (
    RankedListTerms,
    masked_softmax,
    mine_non_trivial,
    negative_weights,
    ranked_list_terms,
)
from .revisited import revisited_evaluate, revisited_map, revisited_ranks
from .validation import (
    check_embedding_shape,
    check_finite,
    check_int,
    check_label_values,
    check_labels,
    check_ref_labels_pairing,
    compute_dtype,
    prepare_embeddings,
    validate_indices_tuple,
)

__all__ = [
    "check_embedding_shape",
    "check_finite",
    "check_int",
    "check_label_values",
    "check_labels",
    "check_ref_labels_pairing",
    "validate_indices_tuple",
    "compute_dtype",
    "prepare_embeddings",
    "euclidean_distances",
    "RankedListTerms",
    "masked_softmax",
    "mine_non_trivial",
    "negative_weights",
    "ranked_list_terms",
    "exact_average_precision",
    "ranked_average_precision",
    "revisited_evaluate",
    "revisited_map",
    "revisited_ranks",
    "histogram_ap",
    "tie_aware_histogram_ap",
    "PairHistogram",
    "pair_categories",
    "pair_histograms",
]
