"""PLACEHOLDER for the fused Triton soft-histogram kernel (written on another branch; that file
replaces this one at merge). It exists only so that :mod:`.dispatch` imports on this branch.

The API :mod:`.dispatch` calls::

    triton_pair_histograms(queries, refs, labels, ref_labels, self_columns, offset, scale,
                           num_intervals, categories=None) -> (N, 2, num_intervals + 1)
"""

from __future__ import annotations

import torch

PLACEHOLDER = True


def triton_pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    labels: torch.Tensor | None,
    ref_labels: torch.Tensor | None,
    self_columns: torch.Tensor | None,
    offset: float,
    scale: float,
    num_intervals: int,
    categories: torch.Tensor | None = None,
) -> torch.Tensor:
    """Not built on this branch: raises ``NotImplementedError``."""
    raise NotImplementedError(
        "the Triton soft-histogram kernel is not part of this build; use backend='gpu' or 'cpu'"
    )
