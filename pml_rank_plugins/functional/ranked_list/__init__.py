"""The Ranked List Loss family (Wang et al., "Ranked List Loss for Deep Metric Learning", CVPR
2019): one module a backend.

* :mod:`.reference`: the equation-level kernel on a precomputed ``(N, M)`` distance matrix,
  every term tied to the paper's equations (8-14); :mod:`.params`: the parameters' checks and
  parametrizations.
* :mod:`.cpu` (steps in :mod:`.cpu_steps`, sparse parts in :mod:`.sparse`): the chunked
  Euclidean kernel and miner of the ``cpu`` backend, O(chunk x M) memory, mined pairs kept as a
  sparse list.
* :mod:`.gpu` (steps in :mod:`.gpu_steps`), :mod:`.gpu_mining`: the ``gpu`` backend's kernel and
  miner, dense chunks and no host synchronisation (the ``triton`` backend's miner too).
* :mod:`.triton_kernel` (kernels in :mod:`.triton_jit`, ``torch.library`` operators in
  :mod:`.triton_ops`): the ``triton`` backend's fused loss kernel, tiles of ``Q R^T``
  recomputed, no ``N x M`` buffer; importable without triton.

The backend is picked where the inputs are prepared, since each backend prepares them its own
way (value-checking and screened on ``cpu``, sync-free on ``gpu``): by
:meth:`pml_rank_plugins.losses.RankedListLoss.compute_loss` and
:meth:`pml_rank_plugins.miners.RankedListMiner.mine` through
:mod:`pml_rank_plugins.utils.ranked_list_backends`, both with
:func:`pml_rank_plugins.functional.backend.resolve_backend`.

Re-exported here: the names of :mod:`.reference` and :mod:`.params` (the former
``functional.ranked_list`` module's namespace) and each backend's entry points.
"""

from ..query_weighting import QUERY_WEIGHTINGS, check_query_weighting, log_weight_sums, query_scales
from .cpu import SparseWeights, chunked_ranked_list_mining, chunked_ranked_list_terms
from .gpu import gpu_ranked_list_terms, gpu_ranked_list_terms_dense
from .gpu_mining import gpu_mining_from_dist, gpu_ranked_list_mining
from .params import (
    ChunkParams,
    check_dist_masks,
    check_embedding_pair,
    check_loss_finite,
    check_loss_range,
    check_rll_params,
    checked_params,
    default_alpha,
    term_weights,
)
from .reference import (
    RankedListTerms,
    masked_softmax,
    mine_non_trivial,
    negative_weights,
    ranked_list_terms,
    scaled_exp_,
)
from .triton_kernel import triton_ranked_list_terms

__all__ = [
    "ChunkParams",
    "QUERY_WEIGHTINGS",
    "RankedListTerms",
    "SparseWeights",
    "check_dist_masks",
    "check_embedding_pair",
    "check_loss_finite",
    "check_loss_range",
    "check_query_weighting",
    "check_rll_params",
    "checked_params",
    "chunked_ranked_list_mining",
    "chunked_ranked_list_terms",
    "default_alpha",
    "gpu_mining_from_dist",
    "gpu_ranked_list_mining",
    "gpu_ranked_list_terms",
    "gpu_ranked_list_terms_dense",
    "log_weight_sums",
    "masked_softmax",
    "mine_non_trivial",
    "negative_weights",
    "query_scales",
    "ranked_list_terms",
    "scaled_exp_",
    "term_weights",
    "triton_ranked_list_terms",
]
