"""``trainer.compile``: a run's models and losses under ``torch.compile``, and what compiling cost.

:func:`compile_experiment` compiles, in place, every model of the run (``trunk``, ``embedder``,
any other) and every loss function with the config's
:class:`~pml_rank_plugins.experiment.compiling.CompileSettings` (``nn.Module.compile``: the
modules stay the same objects, so optimizers, checkpoints (``state_dict`` keys without
``_orig_mod.``), the tester and DDP see them unchanged). Miners stay eager: they run under
``torch.no_grad`` and mostly select index sets of data-dependent size, where a graph would break
anyway. Compiling is lazy: the first call of each module traces and compiles it, so the first
iterations of the first epoch (and the first evaluation, whose eval-mode, no-grad calls are new
graphs) are slower; :class:`CompileMeter` measures that time from Dynamo's own counters.

The measured time (``metrics.json`` ``"compile"``, the run's log) is what this process spent
compiling during this call: Dynamo's frame compilation (tracing and the backend, AOT autograd
and Inductor included) plus the backward graphs compiled at the first backward pass. A second
run in the same process (``compare --jobs 1``) reuses cached graphs where the guards allow and
so reports less.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..experiment.compiling import CompileSettings

LOGGER = logging.getLogger(__name__)
# torch._dynamo.utils.cumulative_time_spent_ns keys (nanoseconds): Dynamo's frame compile
# (its backend compile nested inside) and the lazily compiled backward graphs.
COMPILE_TIMERS = ("entire_frame_compile", "entire_backward_compile")


def compile_experiment(exp) -> list[str]:
    """Compile ``exp``'s models and loss functions in place with ``exp.extra["compile"]``;
    the compiled ones as ``["models.trunk", ..., "loss_funcs.metric_loss"]`` (``[]``: the
    run is eager). A loss that is no ``nn.Module`` is replaced by ``torch.compile`` of it."""
    settings: CompileSettings | None = exp.extra.get("compile")
    if settings is None:
        return []
    names = []
    for group, objects in (("models", exp.models), ("loss_funcs", exp.loss_funcs)):
        for key, obj in objects.items():
            if isinstance(obj, torch.nn.Module):
                obj.compile(**settings.kwargs())
            else:  # a plain callable loss: there is no module to compile in place
                objects[key] = torch.compile(obj, **settings.kwargs())
            names.append(f"{group}.{key}")
    LOGGER.info("torch.compile (%s): %s", describe(settings), ", ".join(names))
    return names


def describe(settings: CompileSettings) -> str:
    """``backend inductor, mode reduce-overhead, fullgraph`` (what the log line names)."""
    parts = [f"backend {settings.backend}"]
    if settings.mode is not None:
        parts.append(f"mode {settings.mode}")
    if settings.fullgraph:
        parts.append("fullgraph")
    if settings.dynamic is not None:
        parts.append(f"dynamic={settings.dynamic}")
    return ", ".join(parts)


def compile_totals() -> dict[str, float] | None:
    """Process totals so far: compile seconds, graphs compiled and graph breaks; ``None``
    where this torch has no such counters (then the time is reported as unknown, not 0)."""
    from torch._dynamo import utils  # noqa: PLC0415 -- torch's, imported by torch.compile anyway

    spent = getattr(utils, "cumulative_time_spent_ns", None)
    counters = getattr(utils, "counters", None)
    if spent is None or counters is None:
        return None
    return {
        "seconds": sum(spent.get(k, 0.0) for k in COMPILE_TIMERS) / 1e9,
        "graphs": float(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": float(sum(counters["graph_break"].values())),
    }


class CompileMeter:
    """Compile time, graphs and graph breaks of this call (differences of :func:`compile_totals`
    since construction); :meth:`new_since_last` for the per-epoch log line."""

    def __init__(self, settings: CompileSettings | None, compiled: list[str]) -> None:
        self.settings, self.compiled = settings, compiled
        self.start = compile_totals() if settings is not None else None
        self.last = self.start
        if settings is not None and self.start is None:
            LOGGER.warning("this torch has no Dynamo compile-time counters; time not reported")

    def since(self, base: dict | None) -> dict[str, float] | None:
        now = compile_totals() if self.settings is not None else None
        if now is None or base is None:
            return None
        return {k: now[k] - base[k] for k in now}

    def new_since_last(self) -> str | None:
        """A log line when compiling took time since the last call (else ``None``)."""
        if self.settings is None:
            return None
        step, total = self.since(self.last), self.since(self.start)
        self.last = compile_totals()
        if step is None or total is None or step["seconds"] <= 0:
            return None
        return (
            f"torch.compile: {step['seconds']:.1f} s compiling this epoch ({total['seconds']:.1f}"
            f" s in all, {int(total['graphs'])} graphs, {int(total['graph_breaks'])} graph breaks)"
        )

    def record(self) -> dict[str, Any] | None:
        """``metrics.json``'s ``"compile"``: the settings, what was compiled and this call's
        ``seconds`` (``null`` when unknown), ``graphs`` and ``graph_breaks``; ``None`` when
        eager."""
        if self.settings is None:
            return None
        spent = self.since(self.start)
        measured = {k: None for k in ("seconds", "graphs", "graph_breaks")}
        if spent is not None:
            measured = {
                "seconds": round(spent["seconds"], 3),
                "graphs": int(spent["graphs"]),
                "graph_breaks": int(spent["graph_breaks"]),
            }
        return {**self.settings.kwargs(), "compiled": list(self.compiled), **measured}
