"""PML miners."""

from .ranked_list_miner import RankedListMiner
from .weighted_pairs import WeightedPairs

__all__ = ["RankedListMiner", "WeightedPairs"]
