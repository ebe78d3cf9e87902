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


def prepare_embeddings(
    embeddings: torch.Tensor, ref_emb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Check queries and references for NaN/inf and cast both to the compute dtype.

    Returns ``(queries, refs, is_self)``; ``is_self`` is whether ``ref_emb`` *is* ``embeddings``
    (the batch ranked against itself, as PML passes it), in which case ``refs is queries``.
    """
    is_self = ref_emb is embeddings
    check_finite(embeddings, "embeddings")
    if not is_self:
        check_finite(ref_emb, "ref_emb")
    dtype = compute_dtype(embeddings.dtype)
    queries = embeddings.to(dtype)
    return queries, queries if is_self else ref_emb.to(dtype), is_self
