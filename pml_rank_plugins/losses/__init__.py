"""PML losses."""

from .cross_batch_memory import CrossBatchMemory
from .diagnosis import diagnose_non_finite
from .fastap import FastAPLoss
from .quantized_ap import QuantizedAPLoss
from .ranked_list import RankedListLoss
from .self_supervised import SelfSupervisedLoss

__all__ = [
    "CrossBatchMemory",
    "FastAPLoss",
    "QuantizedAPLoss",
    "RankedListLoss",
    "SelfSupervisedLoss",
    "diagnose_non_finite",
]
