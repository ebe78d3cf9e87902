"""Stop a run at the first non-finite loss or gradient (PML ``end_of_iteration_hook``).

PML's trainers keep going when a loss turns NaN (``total_loss=nan`` in the progress bar) and the
run ends with a normal-looking ``metrics.json``. :class:`NonFiniteCheck` is chained in front of
the logging hook and raises :class:`NonFiniteError` naming the epoch, the iteration and the loss
(or the model whose gradients) that went non-finite. The runner records the failure in
``metrics.json`` (``"status": "failed"``) and the CLI exits non-zero with the message.

Cost per iteration: one ``torch._foreach_norm`` over all gradients (one fused kernel per device
and dtype), one ``torch.isfinite`` over the stacked losses and norms, and one host sync for the
resulting boolean; the per-name search only runs once something is already non-finite. A
gradient whose norm overflows (entries around 1e19 and above in float32) counts as non-finite.

Two more checks: :func:`check_weights` runs at the end of every epoch, before a checkpoint is
written, so a model with a NaN/inf weight or buffer (e.g. an inf BatchNorm ``running_var`` after
a learning-rate blow-up, with finite losses) is never saved as ``latest.pt``; and
:meth:`NonFiniteCheck.watch` keeps the last embeddings so that a loss that raises on non-finite
input (FastAP, QuantizedAP) is reported by :meth:`NonFiniteCheck.explain` as non-finite
embeddings at that epoch and iteration.

On the ``gpu`` / ``triton`` backends the losses read no input value back (no host sync), so a
NaN embedding or an out-of-range index (clamped on the device) gives a NaN loss rather than an
error. :meth:`NonFiniteCheck.watch_losses` keeps the arguments of the latest call of every loss
and miner of this package (references, no copy); once a loss is non-finite, the check replays
those calls with ``check_values=True``
(:func:`pml_rank_plugins.losses.diagnosis.replay_with_checks`) and the error names the cause as
the ``cpu`` backend would, e.g. ``... check the data. Cause (the batch replayed with check_values=True):
FastAPLoss: embeddings contains 1 non-finite value(s) (NaN or inf), the first embeddings[2, 1] =
nan``. The replay runs only after a non-finite loss: no cost per iteration.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..losses.diagnosis import replay_with_checks, value_checked_modules


class NonFiniteError(RuntimeError):
    """A loss or a gradient became NaN or inf during training."""


def _grads(module: object) -> list[torch.Tensor]:
    if not isinstance(module, torch.nn.Module):
        return []
    return [p.grad for p in module.parameters() if p.grad is not None]


class NonFiniteCheck:
    """``end_of_iteration_hook(trainer)`` that raises :class:`NonFiniteError`, then chains on.

    Args:
        chained: the hook to call afterwards (e.g. PML's logging hook), or ``None``.

    Checks ``trainer.losses`` (every entry, ``total_loss`` included) and the gradients of
    ``trainer.models`` and ``trainer.loss_funcs`` left by the iteration's backward pass.
    ``epoch_loss_sum`` / ``epoch_iterations`` accumulate ``total_loss`` for the epoch summary
    (reset with :meth:`start_epoch`); the sum stays on the device so no extra sync is needed.
    """

    def __init__(self, chained: Callable | None = None):
        self.chained = chained
        self.embeddings: torch.Tensor | None = None
        self.calls: dict[torch.nn.Module, tuple] = {}
        self.start_epoch()

    def watch_losses(self, *groups: dict | None) -> None:
        """Keep the arguments of the latest call of every module with a ``check_values`` switch
        (this package's losses and miners, also inside ``CrossBatchMemory`` or a wrapper) among
        the values of ``groups`` (e.g. the trainer's ``loss_funcs`` and ``mining_funcs``), in
        call order, for :meth:`diagnose`. Tensors are kept detached (no graph, no copy).

        Positional arguments only: a hook that also takes the keywords
        (``with_kwargs=True``) adds an int-keyed dict to the module, which PML's logging hook
        records as a series and its ``record_keeper`` then fails to sort. The keyword the
        trainers' calls carry is ``CrossBatchMemory``'s ``self_index`` (a slot per query of
        the batch it just wrote, valid by construction): its replay ranks the batch against the
        whole memory, which checks the same embeddings and indices."""
        modules = {
            id(module): module
            for group in groups
            for owner in (group or {}).values()
            for module in value_checked_modules(owner)
        }
        for module in modules.values():
            module.register_forward_pre_hook(self._keeper())

    def _keeper(self) -> Callable:
        def keep(module, args) -> None:
            self.calls.pop(module, None)  # re-inserted: the dict's order is the call order
            self.calls[module] = tuple(_detached(a) for a in args)

        return keep

    def diagnose(self) -> str | None:
        """The first failing value check of the kept calls replayed with ``check_values=True``
        (``"<class>: <message>"``), or ``None`` when every input passes. Syncs: call it only
        once something is non-finite."""
        for module, args in list(self.calls.items()):
            cause = replay_with_checks(module, args, {})
            if cause is not None:
                return cause
        return None

    def watch(self, module: torch.nn.Module) -> None:
        """Keep ``module``'s latest output (detached: no graph is kept) for :meth:`explain`."""

        def keep(_module, _inputs, output) -> None:
            self.embeddings = output.detach() if isinstance(output, torch.Tensor) else None

        module.register_forward_hook(keep)

    def explain(self, error: Exception, trainer) -> None:
        """Raise :class:`NonFiniteError` (from ``error``) if the embeddings of the iteration that
        raised ``error`` were not finite; otherwise return (the caller re-raises ``error``)."""
        emb = self.embeddings
        if emb is None or bool(torch.isfinite(emb).all()):
            return
        bad = int((~torch.isfinite(emb)).sum())
        raise NonFiniteError(
            f"non-finite embeddings at {_where(trainer)}: {bad} of {emb.numel()} values are NaN "
            f"or inf ({type(error).__name__}: {error}). The run diverged or its input is bad: "
            "lower the learning rate (optimizers.*) or check the data"
        ) from error

    def start_epoch(self) -> None:
        """Reset the epoch's loss accumulators (``epoch_loss_sum = 0``, ``epoch_iterations =
        0``); called at construction and by the epoch loop before each epoch. O(1)."""
        self.epoch_loss_sum: torch.Tensor | float = 0.0
        self.epoch_iterations = 0

    def mean_loss(self) -> float | None:
        if not self.epoch_iterations:
            return None
        return float(self.epoch_loss_sum) / self.epoch_iterations

    def __call__(self, trainer) -> None:
        try:
            check(trainer)
        except NonFiniteError as error:
            cause = self.diagnose()
            if cause is None:
                raise
            raise NonFiniteError(
                f"{error}. Cause (the batch replayed with check_values=True): {cause}"
            ) from error
        total = trainer.losses.get("total_loss")
        if isinstance(total, torch.Tensor):
            self.epoch_loss_sum = self.epoch_loss_sum + total.detach().double()
            self.epoch_iterations += 1
        if self.chained is not None:
            self.chained(trainer)


def _detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


def _where(trainer) -> str:
    epoch = getattr(trainer, "epoch", "?")
    iteration = getattr(trainer, "iteration", None)
    it = "?" if iteration is None else iteration + 1
    per_epoch = getattr(trainer, "iterations_per_epoch", None)
    of = f" of {per_epoch}" if per_epoch else ""
    return f"epoch {epoch}, iteration {it}{of}"


def check(trainer) -> None:
    """Raise :class:`NonFiniteError` if a loss or gradient of ``trainer`` is not finite."""
    losses = {k: v for k, v in trainer.losses.items() if isinstance(v, torch.Tensor)}
    owners = {**getattr(trainer, "models", {}), **getattr(trainer, "loss_funcs", {})}
    grads = {name: _grads(m) for name, m in owners.items()}
    values = [v.detach().reshape(-1).float() for v in losses.values()]
    flat = [g for gs in grads.values() for g in gs]
    values += _norms(flat)
    if not values:
        return
    device = values[0].device
    if bool(torch.isfinite(torch.cat([v.to(device) for v in values])).all()):
        return
    bad_losses = [k for k, v in losses.items() if not bool(torch.isfinite(v).all())]
    if bad_losses:
        shown = ", ".join(f"{k}={losses[k].detach().cpu().tolist()}" for k in bad_losses)
        raise NonFiniteError(
            f"non-finite loss at {_where(trainer)}: {shown}. The run diverged or its input is "
            "bad: lower the learning rate (optimizers.*) or check the data"
        )
    bad = [n for n, gs in grads.items() if gs and not all(_finite(gs))]
    raise NonFiniteError(
        f"non-finite gradient at {_where(trainer)} in the parameters of {', '.join(bad)} "
        f"(losses were finite: {', '.join(f'{k}={float(v):.6g}' for k, v in losses.items())}). "
        "Lower the learning rate (optimizers.*) or check the model and the loss's parameters"
    )


def _norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """One norm per gradient (fused per device/dtype); inf/NaN anywhere gives a non-finite norm."""
    if not grads:
        return []
    return [n.reshape(1).float() for n in torch._foreach_norm(grads)]


def _finite(grads: Iterable[torch.Tensor]) -> list[bool]:
    return [bool(torch.isfinite(n).all()) for n in _norms(list(grads))]


def check_weights(objs: dict, epoch: int) -> None:
    """Raise :class:`NonFiniteError` naming ``epoch`` and the first non-finite weight or buffer.

    Args:
        objs: ``{name: module}`` (e.g. the models and the loss functions).
        epoch: the epoch that produced them (for the message).
    """
    named = [
        (f"{name}.{key}", t)
        for name, module in objs.items()
        if isinstance(module, torch.nn.Module)
        for key, t in module.state_dict().items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not named:
        return
    # one host sync for all tensors; the per-name search only runs once something is bad
    flags = [torch.isfinite(t).all().reshape(1) for _, t in named]
    device = flags[0].device
    if bool(torch.cat([f.to(device) for f in flags]).all()):
        return
    first = next(name for (name, _), ok in zip(named, flags) if not bool(ok))
    raise NonFiniteError(
        f"non-finite weights after epoch {epoch}: {first} has NaN or inf values; the model is not "
        "saved (checkpoints/latest.pt keeps the last good epoch). Lower the learning rate "
        "(optimizers.*) or check the data"
    )
