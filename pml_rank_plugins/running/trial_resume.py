"""Interrupted tuning trials continue where they stopped (issue 27: "a study killed at any point
resumes with nothing trained twice and nothing lost").

A trial whose process was killed (or whose session ended) is recorded FAIL and does not count
toward ``--trials`` (:func:`~.study.is_interrupted`). When its run folder holds a checkpoint
(``checkpoints/latest.pt``), the next ``tune`` puts a WAITING trial with the same parameters in
the study (``optuna.Study.enqueue_trial``; user attribute ``resumes``: the interrupted trial's
number); the worker that asks for it continues the interrupted run folder from its checkpoint
(``runner.train(resume=True)``: the epochs trained are kept, none is trained again) and first
reports the interrupted trial's validation values to the pruner, so pruning sees the whole
curve. The interrupted trial stays FAIL (a finished trial cannot be changed); a trial whose
number some trial's ``resumes`` names is not requeued again.

A WAITING trial does not count toward ``--trials`` until a worker asks for it
(:func:`~.study.counted_trials`), so the study still ends with ``--trials`` trials that count.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from . import run_folder
from .study import is_interrupted

RESUMES = "resumes"  # attribute of the new trial: the number of the trial it continues


def requeue_interrupted(study: optuna.Study, out_dir: Path) -> list[int]:
    """Enqueue a continuation of every interrupted trial that has a checkpoint inside
    ``out_dir`` and was not requeued before; returns the interrupted trials' numbers. Call it
    under the ask lock, after :func:`~.tune.fail_interrupted_trials`."""
    requeued = []
    trials = study.get_trials(deepcopy=False)
    continued = {t.user_attrs.get(RESUMES) for t in trials}
    for t in trials:
        if not is_interrupted(t) or t.number in continued:
            continue
        run_dir = t.user_attrs.get("run_dir")
        if not run_dir or not run_folder.inside(out_dir, Path(run_dir)):
            continue  # no folder recorded, or one outside --out: never continued
        if not (Path(run_dir) / "checkpoints" / "latest.pt").is_file():
            continue  # killed before its first checkpoint: nothing to continue
        study.enqueue_trial(dict(t.params), user_attrs={RESUMES: t.number})
        requeued.append(t.number)
    return requeued


def continued_trial(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial | None:
    """The interrupted trial ``trial`` continues, or None for a fresh trial."""
    number = trial.user_attrs.get(RESUMES)
    if number is None:
        return None
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def replay_reports(trial: optuna.Trial, interrupted: optuna.trial.FrozenTrial) -> None:
    """Report the interrupted trial's validation values (epoch -> value) on ``trial`` so the
    pruner judges the continued run on its whole curve."""
    for step, value in sorted(interrupted.intermediate_values.items()):
        trial.report(value, step)
