"""The glue of the histogram-AP losses without a host sync (the ``gpu`` / ``triton`` backends).

Each function gives the values of its CPU-path counterpart without reading a tensor value on the
host: every output shape is known before the data exist, so a GPU never waits for the CPU.

* :func:`normalize_rows_sync_free`: ``validation.normalize_rows`` (F.normalize's values,
  overflow-safe, zero gradient for rows below ``eps``) without its two data-dependent branches.
* :func:`prepare_unit_embeddings`: ``validation.prepare_embeddings(..., normalize=True)`` whose
  finiteness check runs only when asked (``check_values``).
* :func:`label_counts`: positives / negatives per query from the labels by sorting and binary
  search instead of ``torch.unique``.
* :func:`mined_categories`: the ``(N, M)`` int8 categories of a miner's pairs.
* :func:`balanced_query_weights`: the class-balanced query weights over the valid queries, by
  sorting instead of ``torch.unique``.
"""

from __future__ import annotations

import torch

from ..chunking import IGNORED, NEGATIVE, POSITIVE
from ..sync_free_inputs import normalize_rows, prepare_embeddings
from ..validation import (
    NORMALIZE_EPS,
)

# Pairs up to which label_counts compares all pairs at once (16 MiB of bools: N = M = 4096).
DENSE_COUNT_PAIRS = 1 << 24


def normalize_rows_sync_free(x: torch.Tensor, eps: float = NORMALIZE_EPS) -> torch.Tensor:
    """``(N, D)`` unit rows: the values and gradient of ``validation.normalize_rows``, without
    a host sync (:func:`pml_rank_plugins.functional.sync_free_inputs.normalize_rows`, shared
    with the Ranked List loss). Every row with a max-abs of 1 or more is scaled by ``2^-e``
    (``e`` the exponent of its max-abs; exact, and neither the direction nor the gradient
    changes), so huge rows do not overflow; rows with ``||x|| < eps`` get ``x / eps``
    (F.normalize's value) as a constant: zero gradient. The gradient ``(g - u (u . g)) / ||x||``
    is written out (17 dispatched operators forward + backward instead of 35). O(N D). Not
    twice differentiable."""
    return normalize_rows(x, eps)


def prepare_unit_embeddings(
    embeddings: torch.Tensor, ref_emb: torch.Tensor, check_values: bool
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(queries, refs, is_self)`` as ``validation.prepare_embeddings(..., normalize=True)``:
    shapes checked (2-D floating, same width), cast to the compute dtype (float16/bfloat16 to
    float32), rows L2-normalized with :func:`normalize_rows_sync_free`. The NaN/inf check reads
    the values, so it runs only with ``check_values``."""
    queries, refs, is_self = prepare_embeddings(embeddings, ref_emb, check_values)
    queries = normalize_rows_sync_free(queries)
    return queries, queries if is_self else normalize_rows_sync_free(refs), is_self


def label_counts(
    labels: torch.Tensor, ref_labels: torch.Tensor, exclude_own: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(num_pos, valid, ranked)``, ``(N,)``: the reference items with the query's label (minus
    one when ``exclude_own``: the query's own column, which carries its label), whether there is
    one (``valid``), and whether there is also one with another label (``ranked``). Up to
    :data:`DENSE_COUNT_PAIRS` pairs one comparison of all pairs and a row sum (two operators,
    N M bytes: fewer dispatches where the loss is host-bound); beyond, sort + two binary
    searches, O((N + M) log M), nothing of size N x M. The same integer counts either way."""
    if len(labels) * len(ref_labels) <= DENSE_COUNT_PAIRS:
        same = torch.eq(labels.view(-1, 1), ref_labels.view(1, -1)).sum(1)
    else:
        if labels.dtype != ref_labels.dtype:
            dtype = torch.promote_types(labels.dtype, ref_labels.dtype)
            labels, ref_labels = labels.to(dtype), ref_labels.to(dtype)
        ordered = torch.sort(ref_labels).values
        same = torch.searchsorted(ordered, labels, right=True) - torch.searchsorted(ordered, labels)
    num_pos = same - 1 if exclude_own else same
    valid = num_pos > 0
    return num_pos, valid, valid & (same < len(ref_labels))


def mined_categories(
    pairs: tuple[torch.Tensor, ...], num_queries: int, num_refs: int, exclude_diagonal: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(categories, num_pos, num_neg)`` of mined pairs ``(a1, p, a2, n)``: an ``(N, M)`` int8
    tensor (0 at the mined positives, 1 at the mined negatives, 2 elsewhere and, with
    ``exclude_diagonal``, on the diagonal) and per-query counts. Duplicated pairs count once.
    A pair mined both ways is an error on the CPU path (``pair_categories``); here, without
    reading values, it counts as a positive (``check_values=True`` on the loss makes it the
    error). O(N M) bytes."""
    a1, p, a2, n = pairs
    device = a1.device
    categories = torch.full((num_queries, num_refs), IGNORED, dtype=torch.int8, device=device)
    categories[a2, n] = NEGATIVE
    categories[a1, p] = POSITIVE
    if exclude_diagonal:
        categories.fill_diagonal_(IGNORED)
    return categories, (categories == POSITIVE).sum(1), (categories == NEGATIVE).sum(1)


def balanced_query_weights(labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(N,)`` class-balanced weights ``w_i = V / (K V_c(i))`` over the ``valid`` queries
    (``V`` valid queries, ``K`` classes among them, ``V_c`` the valid queries of class ``c``);
    weights of invalid queries are finite and meaningless (the caller masks them). Weights over
    the valid queries average 1. Sort + cumulative count + binary search: O(N log N)."""
    ordered, order = torch.sort(labels)
    valid_count = torch.cumsum(valid[order].to(torch.int64), 0)
    valid_count = torch.cat([valid_count.new_zeros(1), valid_count])
    first = torch.searchsorted(ordered, labels)
    last = torch.searchsorted(ordered, labels, right=True)
    per_class = (valid_count[last] - valid_count[first]).double()
    valid_f = valid.double()
    classes = (valid_f / per_class.clamp_min(1)).sum()
    return valid_f.sum() / (classes.clamp_min(1) * per_class.clamp_min(1))
