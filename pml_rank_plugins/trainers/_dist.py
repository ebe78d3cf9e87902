"""The ``torch.distributed`` state the trainers read (no process group: one rank).

Defined in :mod:`pml_rank_plugins.utils.distributed` (the loss wrappers use it too) and
re-exported here and by :mod:`pml_rank_plugins.trainers.distributed`.
"""

from __future__ import annotations

from ..utils.distributed import is_initialized, rank, world_size

__all__ = ["is_initialized", "rank", "world_size"]
