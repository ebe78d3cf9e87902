"""Pairwise Euclidean distance matrix with a lean, exact backward."""

from __future__ import annotations

import torch


class _EuclideanDistances(torch.autograd.Function):
    """``d_ij = ||x_i - y_j||`` via ``|x|^2 + |y|^2 - 2 x.y`` (clamped at 0), as ``torch.cdist``.

    Backward with ``C = grad / d`` (0 where ``d = 0``): ``grad_x = C.sum(1) x - C y`` and
    ``grad_y = C.sum(0) y - C^T x``, each only when that input needs it (``torch.cdist`` always
    computes both). Saves ``x``, ``y`` and ``d``.
    """

    @staticmethod
    def forward(ctx, x, y):
        # |x|^2 is broadcast into the product's output buffer, |y|^2 added in place: no extra
        # (N, M) temporary.
        d = torch.addmm((x * x).sum(1, keepdim=True), x, y.t(), alpha=-2.0)
        d = d.add_((y * y).sum(1).unsqueeze(0)).clamp_min_(0.0).sqrt_()
        ctx.save_for_backward(x, y, d)
        return d

    @staticmethod
    def backward(ctx, grad):
        x, y, d = ctx.saved_tensors
        # grad.to(d.dtype): an upstream op run under autocast may hand back another dtype.
        c = (grad.to(d.dtype) / d).masked_fill_(d == 0, 0.0)  # in place: one buffer fewer
        grad_x = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.addmm(x * c.sum(1, keepdim=True), c, y, alpha=-1.0)
        if ctx.needs_input_grad[1]:
            grad_y = torch.addmm(y * c.sum(0).unsqueeze(1), c.t(), x, alpha=-1.0)
        return grad_x, grad_y


def euclidean_distances(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` Euclidean distances between the rows of ``x`` ``(N, D)`` and ``y`` ``(M, D)``.

    Same formula and zero-distance convention (gradient 0 at ``d = 0``) as ``torch.cdist(x, y)``
    with the matrix-multiply path, but the backward computes only the gradients that are needed:
    with ``y`` detached it costs one ``(N, M) x (M, D)`` product instead of two.
    Computed in the inputs' dtype even under ``torch.autocast`` (which would otherwise run the
    product in bfloat16/float16 and then mix dtypes in the backward); ``x`` and ``y`` must share
    one dtype. O(N M D) time, O(N M) memory.
    """
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"need (N, D) and (M, D) inputs, got {tuple(x.shape)}, {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise ValueError(f"x and y must share one dtype, got {x.dtype} and {y.dtype}")
    with torch.autocast(x.device.type, enabled=False):
        return _EuclideanDistances.apply(x, y)
