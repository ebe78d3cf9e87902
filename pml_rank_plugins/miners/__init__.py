"""PML miners."""

from ..utils.loss_and_miner_utils import WeightedPairs
from .ranked_list_miner import RankedListMiner

__all__ = ["RankedListMiner", "WeightedPairs"]
