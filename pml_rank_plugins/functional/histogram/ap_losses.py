"""Per-query ``1 - AP`` from the histograms, with a closed-form backward (``gpu`` / ``triton``).

The values of :func:`pml_rank_plugins.functional.histogram.reference.histogram_ap` (FastAP eq. 14,
AP_Q eq. 9-11) and :func:`~pml_rank_plugins.functional.histogram.reference.tie_aware_histogram_ap`
(AP_T eq. 13), to float rounding, masked to the ranked queries; the gradient written out instead
of recorded by autograd, so a forward + backward is about 25 dispatched operators instead of 45.

With ``h+``, ``h-`` the histograms (bins most relevant first), ``H+``, ``H`` the cumulative sums of
``h+`` and ``h = h+ + h-``, ``N+`` the number of positives:

* AP_Q / FastAP: ``P_l = H+_l / H_l`` (0 where ``H_l = 0``, where ``h+_l = 0`` too), ``a_l =
  h+_l / H_l``, ``w_lk = [l >= k]``.
* AP_T: ``P_l = (1 + 2 H+_l - h+_l) / (1 + 2 H_l - h_l)``, ``a_l = h+_l / (1 + 2 H_l - h_l)``,
  ``w_lk = 1`` if ``l = k``, ``2`` if ``l > k``.

``AP = (1/N+) sum_l h+_l P_l`` and, since ``P_l`` moves with ``h+_k`` by ``w_lk (1 - P_l) / den_l``
and with ``h-_k`` by ``-w_lk P_l / den_l``::

    dAP/dh+_k = (1/N+) (P_k + sum_l w_lk a_l (1 - P_l)),   dAP/dh-_k = -(1/N+) sum_l w_lk a_l P_l

computed as one product of ``[a, a P, P]`` with a constant ``(3 B, 2 B)`` matrix. O(N B^2) for the
product (B <= a few dozen bins in practice), O(N B) memory.
"""

from __future__ import annotations

import torch

from ..eager_cache import eager_lru_cache


@eager_lru_cache(maxsize=32)  # under torch.compile built in the graph (eager_cache)
def _gradient_matrix(bins: int, tie_aware: bool, dtype, device) -> torch.Tensor:
    """``(3 B, 2 B)``: ``[a, a P, P] @ M = -[sum_l w_lk a_l (1 - P_l) + P_k, -sum_l w_lk a_l P_l]``
    (``d loss / d hist`` up to the per-query factor; ``loss = 1 - AP``). Built from Python
    values."""
    weights = torch.ones(bins, bins, dtype=torch.float64).tril()  # [l, k]: l >= k
    if tie_aware:
        weights = weights + weights.tril(-1)  # 2 where l > k
    zeros = torch.zeros_like(weights)
    matrix = torch.cat(
        [
            torch.cat([-weights, zeros], 1),
            torch.cat([weights, weights], 1),
            torch.cat([-torch.eye(bins, dtype=torch.float64), zeros], 1),
        ]
    )
    return matrix.to(device=device, dtype=dtype)


class MaskedAPLosses(torch.autograd.Function):
    """``(N,)`` losses ``v_i (1 - AP_i)`` with ``v_i = ranked_i`` (times ``weights_i`` if given):
    exactly 0, with no gradient, where ``ranked`` is false; or, with ``mean_over``, their sum
    divided by ``max(mean_over, 1)`` (a 0-dim tensor).

    Inputs: ``hist`` ``(N, 2, B)`` (positive, negative), ``num_pos`` ``(N,)`` (integer or float;
    a constant), ``ranked`` ``(N,)`` bool, ``weights`` ``(N,)`` or ``None``, ``mean_over`` 0-dim
    count or ``None``, ``tie_aware`` (AP_T instead of AP_Q / FastAP).
    """

    @staticmethod
    def forward(ctx, hist, num_pos, ranked, weights, mean_over, tie_aware):
        h_pos = hist[:, 0]
        cum = hist.cumsum(2)
        if tie_aware:
            # 1 + 2 H_l - h_l for both histograms; the all-items denominator adds the two, minus
            # the one counted twice.
            terms = (2 * cum - hist).add_(1)
            numerator = terms[:, 0]
            denominator = terms.sum(1).sub_(1)
        else:
            numerator = cum[:, 0]
            # H_l = 0 only where h+_l = 0: any finite precision gives the same term there.
            denominator = cum.sum(1).clamp_min_(torch.finfo(hist.dtype).tiny)
        precision = numerator / denominator
        # factor_i = v_i / N+_i: loss_i = v_i - factor_i sum_l h+_l P_l.
        mask = ranked.to(hist.dtype) if weights is None else ranked * weights.to(hist.dtype)
        factor = mask / num_pos.clamp_min(1)
        if mean_over is not None:
            mean_over = mean_over.clamp_min(1)
            mask, factor = mask / mean_over, factor / mean_over
        losses = torch.addcmul(mask, (h_pos * precision).sum(1), factor, value=-1)
        ctx.save_for_backward(h_pos, denominator, precision, factor)
        ctx.tie_aware = tie_aware
        return losses if mean_over is None else losses.sum()

    @staticmethod
    def backward(ctx, grad_losses):
        h_pos, denominator, precision, factor = ctx.saved_tensors
        n, bins = h_pos.shape
        matrix = _gradient_matrix(bins, ctx.tie_aware, h_pos.dtype, h_pos.device)
        share = h_pos / denominator
        terms = torch.cat([share, share * precision, precision], 1)
        scale = (factor * grad_losses).unsqueeze(1)
        grad_hist = torch.mm(terms, matrix).mul_(scale)
        return grad_hist.view(n, 2, bins), None, None, None, None, None


def masked_ap_losses(
    hist: torch.Tensor,
    num_pos: torch.Tensor,
    ranked: torch.Tensor,
    tie_aware: bool = False,
    weights: torch.Tensor | None = None,
    mean_over: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(N,)`` ``where(ranked, weights (1 - AP), 0)`` from ``(N, 2, B)`` histograms: AP_Q /
    FastAP, or AP_T with ``tie_aware`` (see the module docstring); with ``mean_over`` (a 0-dim
    count) their sum divided by ``max(mean_over, 1)``. No host sync; O(N B^2)."""
    if hist.ndim != 3 or hist.shape[1] != 2:
        raise ValueError(f"hist must be (N, 2, B), got shape {tuple(hist.shape)}")
    return MaskedAPLosses.apply(hist, num_pos, ranked, weights, mean_over, bool(tie_aware))
