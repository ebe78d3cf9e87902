"""The ``torch.distributed`` state the trainers read, defined once (no process group: one rank).

Re-exported by :mod:`pml_rank_plugins.trainers.distributed`; ``chunked_backward`` imports it
from here so the two trainer modules do not import each other in a cycle.
"""

from __future__ import annotations

import torch.distributed as dist


def is_initialized() -> bool:
    """True when ``torch.distributed`` is available and a process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """``torch.distributed``'s world size, 1 when no process group is initialized."""
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    """This process's rank in the default process group, 0 when none is initialized."""
    return dist.get_rank() if is_initialized() else 0
