"""Helpers shared by the losses and the miners, PML's ``utils`` pattern: import the module,
``pml_rank_plugins.utils.loss_and_miner_utils``; and the exact drop-ins for PML's distributed
wrappers, :class:`DistributedLossWrapper` and :class:`DistributedMinerWrapper`
(``pml_rank_plugins.utils.distributed_loss``), on the primitives of
``pml_rank_plugins.utils.distributed``.

Import order of the package: ``functional`` <- ``utils`` <- ``losses`` / ``miners`` <-
``trainers``; ``losses`` and ``miners`` never import each other.
"""

from .distributed import all_gather_to_owners, all_gather_with_grad
from .distributed_loss import DistributedLossWrapper, DistributedMinerWrapper

__all__ = [
    "DistributedLossWrapper",
    "DistributedMinerWrapper",
    "all_gather_to_owners",
    "all_gather_with_grad",
]
