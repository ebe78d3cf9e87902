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

:class:`OpTrace` also records the operators in order with their arguments' shapes (not values):
two calls with equal traces, no syncing operator and no tensor made from host data launch the
same kernels, the condition for replaying a call as a CUDA graph (``docs/performance.md``, CUDA
graphs).
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


def _signature(value) -> object:
    """What a CUDA graph bakes in of one operator argument: a tensor's shape, dtype, device type,
    strides and storage offset (never its values); a Python scalar, dtype, device or string as
    its ``repr`` (a float's repr, so that two NaNs compare equal); lists, tuples and dicts
    element by element; any other object by its type name."""
    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            tuple(value.shape),
            str(value.dtype),
            value.device.type,
            tuple(value.stride()) if value.layout == torch.strided else None,
            value.storage_offset() if value.layout == torch.strided else None,
        )
    if isinstance(value, (list, tuple)):
        return tuple(_signature(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _signature(item)) for key, item in sorted(value.items()))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, (torch.layout, torch.memory_format)):
        return str(value)
    return type(value).__name__


class OpTrace(OpCounter):
    """An :class:`OpCounter` that also records, in order, each dispatched aten operator with the
    signature of its arguments (``trace``: ``(operator overload, args, kwargs)``, tensors by
    shape, dtype, device type, strides and offset, never by value; :func:`_signature`) and the
    tensors made from host Python data (``host_tensors``: ``aten.lift_fresh``, what
    ``torch.tensor(...)`` dispatches; on CUDA a host-to-device copy).

    Why: a CUDA graph (``torch.cuda.make_graphed_callables``) records the kernels of one call
    and replays them with new values in the same buffers. A replay is only correct if the code
    would have launched the same operators on the same shapes for those values: equal traces of
    one call on two batches of the same shape with different values (labels with another class
    structure, other embeddings), no syncing operator (a host read, refused while capturing) and
    no tensor made from host data after the warm-up calls (its copy synchronises the host) are
    the CPU-side evidence. Example::

        with OpTrace(forbid_syncs=True) as first:
            loss(x1, labels1).backward()
        with OpTrace(forbid_syncs=True) as second:
            loss(x2, labels2).backward()
        assert first.difference(second) is None, first.difference(second)

    O(1) per operator (its arguments' signatures); the trace holds one tuple per operator.
    """

    def __init__(self, forbid_syncs: bool = False):
        super().__init__(forbid_syncs)
        self.trace: list[tuple] = []
        self.host_tensors = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.trace.append((str(func), _signature(args), _signature(kwargs)))
        if func.overloadpacket.__name__ == "lift_fresh":
            self.host_tensors += 1
        return super().__torch_dispatch__(func, types, args, kwargs)

    def difference(self, other: OpTrace) -> str | None:
        """``None`` when the two traces are equal, else where they first differ (the index and
        both entries, or the lengths), for an assertion message."""
        for index, (mine, theirs) in enumerate(zip(self.trace, other.trace)):
            if mine != theirs:
                return f"operator {index} differs:\n  {mine}\n  {theirs}"
        if len(self.trace) != len(other.trace):
            return f"{len(self.trace)} operators against {len(other.trace)}"
        return None
