"""What one run carries from epoch to epoch (:class:`RunState`) and what it ends with
(:class:`RunResult`, written as ``metrics.json``).

:class:`RunState` is the part of ``checkpoints/latest.pt`` that is no model, optimizer or RNG
state: the last epoch trained, the history rows, the best validation epoch and whether the run
stopped on a plateau. :meth:`RunState.checkpoint` adds it to the tensors of
:func:`.checkpoints.make_checkpoint`; :meth:`RunState.restore` reads it back, so a resumed run
continues with exactly the state an uninterrupted one had.

:class:`RunResult` is the one form of a run's outcome: finished (with its test metrics, timing and
``run_info``), failed (the error and the epoch it failed in; the last good checkpoint stays) or
interrupted (``stop_after_epoch`` or a pruner: returned, not written, since the run continues on
``--resume``). The ``metrics.json`` keys are those of earlier versions, in the same order.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import run_folder
from .checkpoints import from_plain, make_checkpoint
from .resume import plateaued

LOGGER = logging.getLogger(__name__)


def _no_best() -> dict:
    return {"epoch": None, "value": None}


@dataclass
class RunState:
    """``epoch``: the last epoch trained (0: none); ``history``: one row per epoch (``epoch``,
    ``train_loss``, ``validation`` when validated); ``best``: ``{"epoch", "value"}`` of the best
    validation primary metric (``None`` until validated); ``stopped_early``: the plateau rule
    (``eval.patience``) stopped the run."""

    epoch: int = 0
    history: list[dict] = field(default_factory=list)
    best: dict = field(default_factory=_no_best)
    stopped_early: bool = False

    @classmethod
    def restore(cls, ckpt: dict, patience: int | None) -> RunState:
        """The state saved in ``latest.pt``'s content ``ckpt``; the plateau is re-judged with
        the (possibly changed) ``patience``, so a longer patience continues a stopped run."""
        best = from_plain(ckpt["best"])
        return cls(
            epoch=int(ckpt["epoch"]),
            history=from_plain(ckpt["history"]),
            best=best,
            stopped_early=plateaued(patience, best, ckpt["epoch"]),
        )

    def checkpoint(self, exp) -> dict:
        """``latest.pt``'s content: the experiment's state (:func:`.checkpoints.make_checkpoint`)
        and this state."""
        ckpt = make_checkpoint(exp, self.epoch, self.history, self.best)
        ckpt["stopped_early"] = self.stopped_early
        return ckpt

    def improves(self, value: float | None) -> bool:
        """``value`` beats the best so far (a missing value never does)."""
        return value is not None and (self.best["value"] is None or value > self.best["value"])

    @property
    def epochs_run(self) -> int:
        return self.history[-1]["epoch"] if self.history else 0

    def best_validation(self) -> dict:
        """The validation metrics of the best epoch (``{}`` when none)."""
        if self.best["epoch"] is None:
            return {}
        return next(h["validation"] for h in self.history if h["epoch"] == self.best["epoch"])


@dataclass
class RunResult:
    """A run's outcome (see the module docstring); :meth:`as_dict` is ``metrics.json``."""

    name: str
    seed: int
    state: RunState
    status: str = "finished"
    test: dict = field(default_factory=dict)
    error: str | None = None
    failed_in_epoch: int | None = None
    timing: dict = field(default_factory=dict)  # train_seconds_this_call, phase_seconds
    run_info: dict | None = None

    @classmethod
    def failed(cls, name: str, seed: int, state: RunState, error: BaseException, epoch: int):
        return cls(
            name,
            seed,
            state,
            "failed",
            error=f"{type(error).__name__}: {error}",
            failed_in_epoch=epoch,
        )

    def as_dict(self) -> dict[str, Any]:
        """``metrics.json``'s content (the keys and order of earlier versions)."""
        state = self.state
        if self.status == "interrupted":
            return {
                "interrupted_after_epoch": state.epoch,
                "history": state.history,
                "best": state.best,
            }
        head: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.status == "failed":
            head.update(error=self.error, failed_in_epoch=self.failed_in_epoch)
        head.update(seed=self.seed, epochs_run=state.epochs_run)
        if self.status != "failed":
            head["stopped_early"] = state.stopped_early
        head.update(best=state.best, history=state.history, test=self.test)
        if self.status != "failed":
            head.update(**self.timing, run_info=self.run_info)
        return head

    def write(self, run_dir: Path) -> None:
        """``RUN_DIR/metrics.json`` (atomic, :func:`.run_folder.write_text`)."""
        run_folder.write_text(Path(run_dir) / "metrics.json", json.dumps(self.as_dict(), indent=2))


def record_failure(result: RunResult, run_dir: Path) -> None:
    """Write a failed run's ``metrics.json`` (never raising: the run's own error is the one to
    raise) and log the failure."""
    try:
        result.write(run_dir)
    except (OSError, run_folder.DiskFullError) as e:
        LOGGER.error("%s: cannot record the failure in metrics.json: %s", run_dir, e)
    LOGGER.error(
        "%s: training failed in epoch %d: %s", run_dir, result.failed_in_epoch, result.error
    )
