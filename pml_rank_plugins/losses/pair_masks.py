"""Moved to :mod:`pml_rank_plugins.utils.loss_and_miner_utils`; kept for this release."""

from ..utils.loss_and_miner_utils import pair_masks

__all__ = ["pair_masks"]
