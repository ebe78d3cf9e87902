"""The ``cpu`` path's input checks and normalization with fewer passes over large inputs: the same
values, gradients and errors as :mod:`~pml_rank_plugins.functional.validation`.

A memory bank makes the glue around a kernel large (65,536 x 128 references: 33 MB per float32
pass), and every full-size temporary is a fresh allocation the OS must fault in. Measured on the
2-core CPU machine (best of 15, 2 threads, busy): ``check_finite`` of 65,536 x 128 218 ms (an
``isfinite`` mask and ``all``) against 2.6 ms for one ``sum``; ``normalize_rows`` 319 ms (about
twelve passes: its overflow rescaling and zero-row rule) against 128 ms for the two passes the
ordinary case needs. These were what kept the RankedList memory-bank step above the floor.

* :func:`check_finite_screened`: one reduction screens (``sum`` is finite when every entry is,
  and NaN/inf otherwise, or inf on overflow of finite values); only a screen that fails runs
  :func:`~pml_rank_plugins.functional.validation.check_finite`, which reports (or passes, after an
  overflow of finite values).
* :func:`normalize_rows_screened`: ``x / max(||x||, eps)`` when every row norm is finite, at
  least ``eps`` and at most the bound above which an entry could need ``normalize_rows``'
  rescaling (checked on the ``(N, 1)`` norms): exactly ``normalize_rows``' operations in that
  case, so the same values and the same autograd graph; any other input goes to
  ``normalize_rows`` itself.

Both read values back (``bool``): the ``cpu`` path only. O(N D).
"""

from __future__ import annotations

import torch

from .validation import NORMALIZE_EPS, check_finite, checked_embeddings, normalize_rows


def check_finite_screened(tensor: torch.Tensor, name: str) -> None:
    """:func:`~pml_rank_plugins.functional.validation.check_finite` (same errors), after a
    one-``sum`` screen that passes every finite tensor whose sum does not overflow."""
    if tensor.numel() and bool(torch.isfinite(tensor.detach().sum())):
        return
    check_finite(tensor, name)


def normalize_rows_screened(x: torch.Tensor, eps: float = NORMALIZE_EPS) -> torch.Tensor:
    """:func:`~pml_rank_plugins.functional.validation.normalize_rows`'s values and gradients in
    two passes for ordinary rows (see the module docstring)."""
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return normalize_rows(x, eps)
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    # normalize_rows rescales a row when an entry exceeds this bound; an entry above it makes the
    # row's norm exceed it too, so norms within it mean no row is rescaled.
    bound = (torch.finfo(x.dtype).max / (4 * x.shape[1])) ** 0.5
    with torch.no_grad():
        extremes = torch.aminmax(norm.detach())
        ordinary = bool(extremes.min >= eps) and bool(extremes.max <= bound)
    if not ordinary:  # NaN norms fail both comparisons
        return normalize_rows(x, eps)
    return x / norm.clamp_min(eps)


def prepare_embeddings_screened(
    embeddings: torch.Tensor, ref_emb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """:func:`~pml_rank_plugins.functional.validation.prepare_embeddings` (``normalize=False``)
    with the screened finiteness check: the same checks, errors and outputs."""
    return checked_embeddings(embeddings, ref_emb, check_finite_screened)


__all__ = ["check_finite_screened", "normalize_rows_screened", "prepare_embeddings_screened"]
