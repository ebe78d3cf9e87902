"""PML's CrossBatchMemory, accepting this plugin's list-wise losses too."""

from __future__ import annotations

from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory

PLUGIN_LOSSES = ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss"]


class CrossBatchMemory(PMLCrossBatchMemory):
    """PML's ``CrossBatchMemory`` (rank each batch against a queue of past embeddings), whose
    allow-list of loss class names also holds ``FastAPLoss``, ``QuantizedAPLoss`` and
    ``RankedListLoss`` (PML 2.9.0 rejects any name not on its list, ours included).

    It works unchanged because PML passes the memory as ``ref_emb``/``ref_labels`` together with an
    ``indices_tuple`` of all (query, memory) pairs minus each query's own slot, and our losses
    restrict every query's ranked list to exactly those pairs. Same arguments as PML's class.
    """

    @staticmethod
    def supported_losses():
        return PMLCrossBatchMemory.supported_losses() + PLUGIN_LOSSES
