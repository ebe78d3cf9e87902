"""Average precision from positive/negative histograms, and the exact AP used as ground truth.

Histograms are ``(N, B)`` per query, bins ordered from most to least relevant (small distance or
large similarity first). With ``h+``, ``h-`` the histograms, ``H+``, ``H`` the cumulative sums of
``h+`` and ``h+ + h-``, and ``N+`` the number of positives:

* FastAP (Cakir et al. CVPR 2019, eq. 14) and mAP_Q (Revaud et al. ICCV 2019, eq. 9-11) are the
  same expression of their histograms: ``AP = (1/N+) sum_l h+_l H+_l / H_l`` (precision at bin
  ``l`` times the recall increment), with terms where ``H_l = 0`` set to 0.
* Tie-aware mAP_T (Revaud eq. 13): ``P_l = (1 + h+_l + 2 H+_{l-1}) / (1 + h_l + 2 H_{l-1})``,
  ``AP_T = (1/N+) sum_l h+_l P_l``.

All are O(N B). Queries with ``N+ = 0`` get AP 0 here; callers exclude them.
"""

from __future__ import annotations

import torch

from ..average_precision import ranked_average_precision


def histogram_ap(h_pos: torch.Tensor, h_neg: torch.Tensor, num_pos: torch.Tensor) -> torch.Tensor:
    """``(N,)`` FastAP / AP_Q: ``(1/N+) sum_l h+_l H+_l / H_l`` (FastAP eq. 14, Revaud eq. 11)."""
    cum_pos = h_pos.cumsum(dim=1)
    cum_all = (h_pos + h_neg).cumsum(dim=1)
    nonempty = cum_all > 0
    # where() alone would still back-propagate inf * 0 = NaN from an unclamped 0/0.
    precision = torch.where(
        nonempty, cum_pos / cum_all.clamp_min(torch.finfo(cum_all.dtype).tiny), 0
    )
    return (h_pos * precision).sum(dim=1) / num_pos.clamp_min(1)


def tie_aware_histogram_ap(
    h_pos: torch.Tensor, h_neg: torch.Tensor, num_pos: torch.Tensor
) -> torch.Tensor:
    """``(N,)`` tie-aware AP_T (Revaud eq. 13): precision of a bin averaged over its ties."""
    h_all = h_pos + h_neg
    before_pos = h_pos.cumsum(dim=1) - h_pos
    before_all = h_all.cumsum(dim=1) - h_all
    precision = (1 + h_pos + 2 * before_pos) / (1 + h_all + 2 * before_all)
    return (h_pos * precision).sum(dim=1) / num_pos.clamp_min(1)


def exact_average_precision(scores: torch.Tensor, relevant: torch.Tensor) -> torch.Tensor:
    """``(N,)`` true AP of each row ranked by descending ``scores`` (ties in index order), with
    ``relevant`` (bool, ``(N, M)``) marking positives. Rows without a positive get 0.
    O(N M log M); not differentiable (a test oracle)."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    ap = ranked_average_precision(torch.gather(relevant, 1, order))
    return torch.nan_to_num(ap, nan=0.0)  # rows without a positive score 0
