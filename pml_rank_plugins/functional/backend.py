"""Which implementation of a pairwise kernel runs: the one dispatch rule of every loss family.

Backends:

* ``cpu``: the chunked kernels tuned for CPU caches (``functional/histogram/cpu.py``,
  ``functional/ranked_list/cpu.py``); the reference results, bit-identical to earlier
  releases.
* ``gpu``: the same mathematics written for an accelerator: few large chunks sized from a fixed
  memory budget (:func:`~pml_rank_plugins.functional.chunking.rows_per_chunk` with
  ``bytes_per_pair``), and no host synchronisation in forward or backward (masks and
  multiplications instead of ``nonzero`` / boolean indexing, no ``.item()``). It runs on any
  device, so CPU CI tests it.
* ``triton``: the fused Triton kernels (the soft-histogram AP losses,
  ``functional/histogram/triton_kernel.py``; the Ranked List loss,
  ``functional/ranked_list/triton_kernel.py``), else the ``gpu`` path (the miner, other
  distances). Needs the ``triton`` package; on CPU it runs only under
  ``TRITON_INTERPRET=1`` (for tests). The fused kernels compute in float32: float16 / bfloat16
  inputs are upcast, float64 is refused with a ``TypeError`` rather than silently rounded.
* ``auto`` (the default): the fastest backend that is correct for the tensors (see
  :func:`auto_backend`): ``cpu`` for CPU tensors; on CUDA ``triton`` where the package imports
  and the dtype is float32, float16 or bfloat16, else ``gpu`` (so float64 under ``auto`` runs on
  ``gpu`` and never errors); ``gpu`` on any other device.

Selection, strongest first: a loss's ``backend=`` keyword, the innermost :func:`use_backend`
context, the ``PML_RANK_BACKEND`` environment variable, ``auto``. A name outside
:data:`BACKENDS`, or ``triton`` where the package cannot be imported, is a ``ValueError`` naming
where the value came from: never a silent fallback.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator

import torch

ENV_VAR = "PML_RANK_BACKEND"
BACKENDS = ("auto", "cpu", "gpu", "triton")
_local = threading.local()


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (not whether a GPU exists). Asked once per
    process (``find_spec`` costs about 80 us, once per loss call otherwise)."""
    return importlib.util.find_spec("triton") is not None


def check_backend(name, source: str) -> str:
    """``name`` if it is one of :data:`BACKENDS` (and ``triton`` is importable when asked for),
    else a ``ValueError`` naming ``source`` (the keyword, context or variable it came from)."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}; got {name!r}")
    if name == "triton" and not triton_available():
        raise ValueError(
            f"{source}=triton, but the triton package cannot be imported; install triton "
            "(it comes with CUDA builds of torch on Linux) or choose gpu or cpu"
        )
    return name


def requested_backend(backend: str | None = None) -> str:
    """The backend asked for, before the device decides ``auto``: ``backend`` (a keyword) if
    given, else the innermost :func:`use_backend`, else ``$PML_RANK_BACKEND``, else ``auto``."""
    if backend is not None:
        return check_backend(backend, "backend")
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    value = os.environ.get(ENV_VAR)
    if value is None or value == "":
        return "auto"
    return check_backend(value.strip().lower(), ENV_VAR)


# The dtypes the fused Triton kernels compute (float16 / bfloat16 are upcast to float32 inside).
TRITON_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


def auto_backend(device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """What ``auto`` means for tensors of ``dtype`` on ``device``: ``cpu`` on the CPU; on CUDA
    ``triton`` if the package imports (:func:`triton_available`) and ``dtype`` is in
    :data:`TRITON_DTYPES`, else ``gpu``; ``gpu`` on any other device (``meta``, ``mps``, ...).
    ``dtype=None`` (not known) is ``gpu`` on CUDA: the path that is correct for every dtype.
    O(1); reads no tensor (a ``torch.device`` and a dtype are enough, which is how it is tested
    on a machine without a GPU)."""
    kind = torch.device(device).type
    if kind == "cpu":
        return "cpu"
    if kind == "cuda" and dtype in TRITON_DTYPES and triton_available():
        return "triton"
    return "gpu"


def resolve_backend(
    device: torch.device | str, backend: str | None = None, *, dtype: torch.dtype | None = None
) -> str:
    """The backend that runs for ``dtype`` tensors on ``device``: ``cpu``, ``gpu`` or ``triton``.

    The requested one (:func:`requested_backend`) unless it is ``auto``, which is
    :func:`auto_backend` ``(device, dtype)``. ``dtype`` is the embeddings' dtype; ``None`` (the
    default, for callers that do not know it) never picks ``triton``. An explicit ``triton``
    is returned whatever the dtype: the kernel refuses float64 itself, with a ``TypeError``
    naming the cpu and gpu backends. O(1); reads no tensor."""
    name = requested_backend(backend)
    if name != "auto":
        return name
    return auto_backend(device, dtype)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[str]:
    """Run the enclosed code with backend ``name`` (overrides ``$PML_RANK_BACKEND``; a loss's
    ``backend=`` keyword still wins). Thread-local, nestable.

    Example::

        with use_backend("gpu"):
            loss = loss_func(embeddings, labels)
            loss.backward()  # backward reuses what forward decided; no need to stay inside
    """
    check_backend(name, "use_backend")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(name)
    try:
        yield name
    finally:
        stack.pop()


def checks_values(backend: str, check_values: bool | None = None) -> bool:
    """Whether a kernel reads input *values* back to validate them (finiteness, label values):
    ``check_values`` if given, else ``True`` on the ``cpu`` backend and ``False`` on ``gpu`` /
    ``triton``, where each check would synchronise the host with the device on every call (the
    trainers check the loss once per step instead). Shape, dtype and device checks, which read no
    value, always run."""
    if check_values is not None:
        return bool(check_values)
    return backend == "cpu"


def check_backend_options(backend, check_values) -> tuple[str | None, bool | None]:
    """``(backend, check_values)``, the two keywords of every loss and miner, checked at
    construction: ``backend`` ``None`` or one of :data:`BACKENDS` (:func:`check_backend`),
    ``check_values`` ``None`` or a bool (``ValueError`` otherwise)."""
    if backend is not None:
        check_backend(backend, "backend")
    if check_values is not None and not isinstance(check_values, bool):
        raise ValueError(f"check_values must be None, True or False, got {check_values!r}")
    return backend, check_values
