"""PML losses."""

from .fastap import FastAPLoss
from .quantized_ap import QuantizedAPLoss
from .ranked_list import RankedListLoss

__all__ = ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss"]
