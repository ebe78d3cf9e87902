"""Which reference items enter each query's ranked list, as dense boolean masks.

Every list-wise loss here ranks, for each query ``i``, the reference items ``j`` with
``pos[i, j]`` (relevant) or ``neg[i, j]`` (irrelevant); all other pairs are ignored.

* Without ``indices_tuple``: positives are same-label pairs, negatives the rest; when the
  reference set is the batch itself (``ref_emb`` not given) the diagonal (self-pair) is removed.
* With ``indices_tuple`` from any PML miner (pairs ``(a1, p, a2, n)`` or triplets
  ``(a, p, n)``, converted to pairs as PML does): the list of query ``i`` is restricted to its
  mined positives ``{p : a1 = i}`` and mined negatives ``{n : a2 = i}``. Duplicated pairs count
  once. A query that appears in no mined positive (or negative) pair has no positive (or
  negative) and is skipped by the loss.

Memory O(N M) bytes for N queries and M reference items.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.validation import validate_indices_tuple


def pair_masks(
    labels: torch.Tensor,
    ref_labels: torch.Tensor,
    indices_tuple=None,
    exclude_self: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(pos, neg)``, two ``(N, M)`` bool masks over (query, reference) pairs.

    Args:
        labels: ``(N,)`` query labels.
        ref_labels: ``(M,)`` reference labels.
        indices_tuple: ``None``, a PML pair tuple ``(a1, p, a2, n)`` or triplet ``(a, p, n)``.
        exclude_self: remove the diagonal (the batch is its own reference set; needs N == M).

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
    return pos, neg
