"""Input preparation for the ``gpu`` / ``triton`` backends, reading no tensor value on the host.

The ``cpu`` path's helpers (:mod:`~pml_rank_plugins.functional.validation`) read values back:
``check_finite`` (``bool(isfinite(x).all())``), ``normalize_rows`` (``bool(any())`` to skip its
rescaling), ``validate_indices_tuple`` (``int(idx.min())``). On an accelerator each is a host
synchronisation per call. Here:

* :func:`normalize_rows`: the values of
  :func:`~pml_rank_plugins.functional.validation.normalize_rows` (bit-identical: its rescaling and
  zero-row rule are applied with ``where`` instead of being skipped when not needed), as one
  autograd function with the analytic backward ``(g - u (g . u)) / ||x||`` (0 for rows with
  ``||x|| < eps``): 13 operators forward and 4 backward instead of about 35.
* :func:`prepare_embeddings`: shape and dtype checks always; finiteness only with
  ``check_values``.
* ``indices_tuple``: :func:`~pml_rank_plugins.functional.validation.validate_indices_tuple`
  with ``check_values``: the structure always (type, integer dtype, 1-D, lengths), index ranges
  only with ``check_values`` (an out-of-range index then fails in the indexing kernel instead: a
  device-side assert on CUDA, an ``IndexError`` on CPU).

Pure torch. All O(N D) or O(number of indices).
"""

from __future__ import annotations

import contextlib

import torch

from .validation import NORMALIZE_EPS, check_finite, checked_embeddings


class _UnitRows(torch.autograd.Function):
    """``x / max(||x||, eps)`` per row with ``normalize_rows``' overflow rescaling and zero-row
    rule; backward ``(g - u (g . u)) / ||x||``, 0 on rows with ``||x|| < eps``.

    Every row with a max-abs of 1 or more is scaled by ``p = 2^-e`` (``e`` the exponent of its
    max-abs): exact, the same direction, and the same values as ``normalize_rows``, which scales
    only rows past its overflow bound (scaling by a power of two multiplies every square and the
    norm exactly, so the quotient is unchanged). A scaled row has ``norm >= 0.5 > eps``, so the
    ``eps`` floor only ever applies to unscaled rows, as there. 13 operators forward, 4 backward
    (issue 39: host time per call)."""

    @staticmethod
    def forward(ctx, x, eps):
        max_abs = x.abs().amax(dim=1, keepdim=True) if x.shape[1] else x.new_zeros(len(x), 1)
        # p = 2^-e = mantissa / max_abs (exact, in x's dtype), at most 1: rows below 1 stay
        # unscaled (2^-e of a subnormal would overflow); a zero row (0 / 0) too.
        power = torch.frexp(max_abs).mantissa.div_(max_abs).clamp_max_(1.0).nan_to_num_(nan=1.0)
        scaled = x * power
        norm = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
        denominator = norm.clamp_min(eps)
        unit = scaled / denominator
        # d unit / d x = (I - u u^T) / ||x|| = (I - u u^T) p / norm; zero for the tiny rows.
        ctx.save_for_backward(unit, (power / denominator).mul_(norm >= eps))
        return unit

    @staticmethod
    def backward(ctx, grad):
        unit, inverse = ctx.saved_tensors
        along = (unit * grad).sum(1, keepdim=True)
        return torch.addcmul(grad, unit, along, value=-1).mul_(inverse), None


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)`` where autocast is on for ``device_type``,
    else a no-op context: the same effect (nothing to turn off), about 10 us less per call on
    the host, where the ``gpu`` / ``triton`` paths are host-bound at small N. A device type
    autocast does not know gets ``torch.autocast``'s own error, as before."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:
        enabled = True
    return torch.autocast(device_type, enabled=False) if enabled else contextlib.nullcontext()


def normalize_rows(x: torch.Tensor, eps: float = NORMALIZE_EPS) -> torch.Tensor:
    """L2-normalized rows of ``(N, D)`` ``x``: the values of
    :func:`~pml_rank_plugins.functional.validation.normalize_rows` (``F.normalize``'s values, no
    overflow for huge rows, zero rows stay zero with zero gradient), with no host
    synchronisation. The gradient is the analytic one (equal to autograd's through
    ``normalize_rows`` up to rounding). O(N D)."""
    return _UnitRows.apply(x, eps)


def prepare_embeddings(
    embeddings: torch.Tensor, ref_emb: torch.Tensor, check_values: bool = False
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``prepare_embeddings`` of :mod:`~pml_rank_plugins.functional.validation` without reading
    values unless ``check_values``: 2-D, same width, floating point (always); no NaN/inf (only
    with ``check_values``). Returns ``(queries, refs, is_self)`` in the compute dtype
    (float16/bfloat16 -> float32)."""
    return checked_embeddings(
        embeddings, ref_emb, check_finite if check_values else None, same_device=True
    )


__all__ = ["autocast_off", "normalize_rows", "prepare_embeddings"]
