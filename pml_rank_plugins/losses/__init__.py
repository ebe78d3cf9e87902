"""PML losses."""

from .ranked_list import RankedListLoss

__all__ = ["RankedListLoss"]
