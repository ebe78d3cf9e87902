"""Input checks and dtype policy shared by every loss kernel."""

from __future__ import annotations

import torch


def check_finite(tensor: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` if ``tensor`` holds NaN or inf. O(numel)."""
    if not torch.isfinite(tensor).all():
        bad = (~torch.isfinite(tensor)).sum().item()
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf)")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel computes in: float16/bfloat16 are promoted to float32, others kept."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype
