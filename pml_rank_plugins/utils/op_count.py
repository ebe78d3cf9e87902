"""Count the aten operators a piece of code dispatches, and catch the ones that synchronise an
accelerator with the host, on any device (the CPU included, so CI can check GPU code paths).

A *syncing* operator is one whose result the host must read before it can go on: on CUDA it
blocks the CPU until the GPU has finished everything queued before it (``nonzero`` and boolean
indexing, whose output size depends on the data; ``item`` / ``bool(tensor)`` / ``tolist``;
``unique``; ``bincount`` without ``minlength``; ``repeat_interleave`` without ``output_size``;
``equal``). One such call per chunk turns a GPU kernel pipeline into a host-bound loop.

Example::

    with OpCounter() as ops:
        loss_func(embeddings, labels).backward()
    print(ops.total, ops.syncs)            # aten operators dispatched, syncing operators seen
    with OpCounter(forbid_syncs=True):     # raises SyncError at the first syncing operator
        ...

Counting happens under :class:`torch.utils._python_dispatch.TorchDispatchMode`, so it sees
autograd's backward operators too (run ``backward()`` inside the block). Views and metadata-only
operators (``view``, ``t``, ``as_strided``, ``detach``, ...) are counted like any other: the count
is of dispatched operators, a CPU proxy for launched kernels, not the kernel count itself.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operator packets (``torch.ops.aten.X``) that make the host wait for the device's result.
SYNCING_PACKETS = frozenset(
    {
        "nonzero",
        "_local_scalar_dense",
        "is_nonzero",
        "item",
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "bincount",
        "equal",
        "allclose",
        "argwhere",
        "_assert_async",
    }
)


class SyncError(RuntimeError):
    """Raised by ``OpCounter(forbid_syncs=True)`` at the first syncing operator."""


def _is_bool_index(func, args) -> bool:
    """``x[mask]`` with a boolean mask: its output size depends on the data (a nonzero)."""
    if func.overloadpacket not in (torch.ops.aten.index, torch.ops.aten._unsafe_index):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def is_syncing(func, args, kwargs) -> bool:
    """Whether dispatching ``func(*args, **kwargs)`` makes the host wait for the device."""
    name = func.overloadpacket.__name__
    if name in SYNCING_PACKETS:
        # bincount with minlength still needs max(input) for its size; both sync.
        return True
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
    if name in ("_to_copy", "copy_"):
        # A copy from an accelerator to the CPU.
        src = args[1] if name == "copy_" else args[0]
        dst_device = args[0].device if name == "copy_" else kwargs.get("device")
        if isinstance(src, torch.Tensor) and dst_device is not None:
            return src.device.type not in ("cpu", "meta") and torch.device(dst_device).type == "cpu"
        return False
    return _is_bool_index(func, args)


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten operators (``counts``: name -> calls; ``total``) and syncing ones
    (``sync_counts``; ``syncs``). ``forbid_syncs=True`` raises :class:`SyncError` naming the
    operator instead of running it."""

    def __init__(self, forbid_syncs: bool = False):
        super().__init__()
        self.forbid_syncs = forbid_syncs
        self.counts: Counter[str] = Counter()
        self.sync_counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        self.counts[name] += 1
        if is_syncing(func, args, kwargs):
            self.sync_counts[name] += 1
            if self.forbid_syncs:
                raise SyncError(f"syncing operator aten.{name} dispatched (forbid_syncs=True)")
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        """Aten operators dispatched inside the block."""
        return sum(self.counts.values())

    @property
    def syncs(self) -> int:
        """Syncing operators dispatched inside the block."""
        return sum(self.sync_counts.values())
