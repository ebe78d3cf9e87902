"""Average precision of ranked relevance lists (the exact, non-differentiable definition).

``AP = (1/P) sum_k rel_k * (#relevant in ranks 1..k) / k`` over a ranked list with ``P``
relevant items. The histogram losses approximate it (:mod:`.histogram_ap`); evaluation and the
tests' oracles use this exact form. The Revisited Oxford/Paris benchmark uses a different,
trapezoidal AP (:func:`.revisited.average_precision`, the official ``compute_ap``).
"""

from __future__ import annotations

import torch


def ranked_average_precision(relevant_ranked: torch.Tensor) -> torch.Tensor:
    """``(Q,)`` float64 AP of each row of a ``(Q, R)`` relevance matrix already in rank order.

    Args:
        relevant_ranked: bool or 0/1 ``(Q, R)``; entry ``(q, k)`` says whether the item at rank
            ``k + 1`` of query ``q`` is relevant.

    Returns:
        ``(Q,)`` float64; NaN for a row without a relevant item (the caller decides whether such
        a query is skipped or scored 0). O(Q R).
    """
    rel = torch.as_tensor(relevant_ranked).to(torch.float64)
    hits = rel.cumsum(dim=1)
    ranks = torch.arange(1, rel.shape[1] + 1, dtype=torch.float64, device=rel.device)
    return (rel * hits / ranks).sum(dim=1) / rel.sum(dim=1)
