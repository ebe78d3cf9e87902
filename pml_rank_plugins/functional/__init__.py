"""Pure tensor functions (torch only, no PML import)."""

from .validation import check_finite, compute_dtype

__all__ = ["check_finite", "compute_dtype"]
