"""Name the cause of a non-finite loss on the backends that do not read input values back.

On the ``gpu`` / ``triton`` backends the value checks (NaN/inf embeddings, index ranges,
``self_index`` slots, a miner's weights) are off by default: each would synchronise the host with
the device on every call. A bad input then gives a NaN loss (out-of-range indices are clamped
on the device and the loss is made NaN, see
:func:`~pml_rank_plugins.functional.validation.clamp_indices_tuple`). Once a loop has seen the
NaN (one read of the loss, which a training loop does anyway), :func:`diagnose_non_finite`
replays that one call with ``check_values=True``: the message of the check that fails names the
argument and the bad element, as the ``cpu`` backend's checks do at the call.
"""

from __future__ import annotations

import torch

from ..functional.validation import check_finite
from .cross_batch_memory import CrossBatchMemory


def value_checked_modules(loss_func: object) -> list[torch.nn.Module]:
    """The modules of ``loss_func`` (itself included) that have a ``check_values`` switch: this
    package's losses and miners, also inside a wrapper. Empty for PML's own losses."""
    if not isinstance(loss_func, torch.nn.Module):
        return []
    return [m for m in loss_func.modules() if hasattr(m, "check_values")]


def diagnose_non_finite(
    loss_func,
    embeddings: torch.Tensor,
    labels: torch.Tensor | None = None,
    indices_tuple=None,
    ref_emb: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    self_index: torch.Tensor | None = None,
) -> str | None:
    """Replay ``loss_func(embeddings, labels, indices_tuple, ref_emb, ref_labels[, self_index])``
    with every value check on; the failing check's message, or ``None`` if every input passes.

    Call it with the arguments of the call whose loss was not finite (e.g. after
    ``if not torch.isfinite(loss):``). The message names the argument and the first bad
    element, e.g. ``FastAPLoss: embeddings contains 1 non-finite value(s) (NaN or inf), the
    first embeddings[2, 1] = nan`` or ``RankedListLoss: indices_tuple[3] (negatives) has index
    40 >= 8 reference rows``. For a loss without a ``check_values`` switch (PML's), the
    embeddings and ``ref_emb`` are checked for NaN/inf. ``None`` means the inputs are valid: the
    loss itself went non-finite (a learning rate too high, weights already blown up).

    The replay runs under ``torch.no_grad`` on the same backend, with ``check_values`` set to
    ``True`` on every module that has it and restored afterwards; it costs one forward plus the
    host syncs of the checks, paid only after a non-finite loss. It calls ``loss_func`` again,
    so pass a stateless loss: for ``CrossBatchMemory`` (whose call writes its memory), pass its
    ``.loss`` with ``ref_emb`` / ``ref_labels`` / ``self_index`` of the memory.

    Raises:
        ValueError: for a ``CrossBatchMemory`` (see above). Anything else the replay raises
            (other than the checks' ``ValueError``, which is returned) propagates.
    """
    if isinstance(loss_func, CrossBatchMemory):
        raise ValueError(
            "diagnose_non_finite replays the call: CrossBatchMemory would write its memory "
            "again; pass its .loss with ref_emb / ref_labels / self_index of the memory"
        )
    if not value_checked_modules(loss_func):
        try:
            check_finite(embeddings, "embeddings")
            if ref_emb is not None:
                check_finite(ref_emb, "ref_emb")
        except ValueError as e:
            return f"{type(loss_func).__name__}: {e}"
        return None
    kwargs = {} if self_index is None else {"self_index": self_index}
    return replay_with_checks(
        loss_func, (embeddings, labels, indices_tuple, ref_emb, ref_labels), kwargs
    )


def replay_with_checks(module: torch.nn.Module, args: tuple, kwargs: dict) -> str | None:
    """``module(*args, **kwargs)`` again under ``torch.no_grad`` with ``check_values=True`` on
    every module of :func:`value_checked_modules` (restored afterwards, also on an error):
    ``"<class>: <message>"`` of the check's ``ValueError``, or ``None`` when the call passes.
    The miner's call order (``embeddings, labels, ref_emb, ref_labels``) works as well as the
    losses'. Other exceptions propagate."""
    modules = value_checked_modules(module)
    saved = [m.check_values for m in modules]
    try:
        for m in modules:
            m.check_values = True
        with torch.no_grad():
            module(*args, **kwargs)
    except ValueError as e:
        return f"{type(module).__name__}: {e}"
    finally:
        for m, value in zip(modules, saved):
            m.check_values = value
    return None


__all__ = ["diagnose_non_finite", "replay_with_checks", "value_checked_modules"]
