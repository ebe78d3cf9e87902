"""Train or evaluate a run folder: the entry points ``pml-rank train`` and ``eval`` call.

A config with ``split: {mlrc_protocol: ...}`` and no ``split.fold`` is the MLRC protocol (one run
per fold, :mod:`.mlrc`); every other config is one run (:mod:`.training`, :mod:`.evaluate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from ..experiment.spec import RunSpec
from .evaluate import evaluate_run
from .mlrc import evaluate_mlrc, train_mlrc
from .training import load_run_config, train_run


def train(
    config: RunSpec | Mapping | None,
    run_dir: str | Path,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
    on_epoch: Callable[[dict], bool] | None = None,
) -> dict:
    """Train ``config`` into ``run_dir`` and return the ``metrics.json`` content.

    ``resume=True`` continues from ``checkpoints/latest.pt`` (``config`` may be ``None`` to reuse
    ``run_dir/config.yaml``; only ``resume.BUDGET_KEYS`` may differ from it, e.g. more epochs
    to extend a finished run). Without ``resume``, a folder that already holds a run is refused
    unless ``overwrite``. The folder is locked for the whole call (``run_folder.lock``; under
    torchrun by rank 0, which alone writes files and evaluates). ``stop_after_epoch`` stops early
    as if interrupted (for tests and budgeted runs); the run can then be resumed. A non-finite
    loss or gradient raises :class:`.nonfinite.NonFiniteError`; any failure during training is
    recorded in ``metrics.json`` (``"status": "failed"``). MLRC configs train every fold (same
    folder policy: lock, refusal, ``overwrite`` removing only our outputs). ``config``: a
    :class:`~pml_rank_plugins.experiment.RunSpec` (a config mapping is parsed here).
    """
    run_dir = Path(run_dir)
    spec = load_run_config(config, run_dir)
    if spec.protocol.all_folds:  # one run per fold
        if on_epoch is not None:
            raise ValueError("on_epoch is for single runs; an MLRC config trains one run per fold")
        return train_mlrc(spec, run_dir, resume, stop_after_epoch, device, overwrite)
    return train_run(spec, run_dir, resume, stop_after_epoch, device, overwrite, on_epoch)


def evaluate(
    run_dir: str | Path,
    which: str = "best",
    device: str | None = None,
    data_root: str | None = None,
) -> dict:
    """Rebuild a finished/interrupted run, load ``which`` weights and evaluate every eval split.

    Writes and returns ``RUN_DIR/eval.json``: ``{split: {metric: value}}`` (for MLRC, every fold
    and the concatenated/separated test). ``data_root`` replaces the saved config's (data moved
    since training).
    """
    spec = RunSpec.load(run_dir, data_root)
    if spec.protocol.all_folds:
        return evaluate_mlrc(run_dir, which, device, data_root, spec=spec)
    return evaluate_run(run_dir, which, device, data_root, spec=spec)
