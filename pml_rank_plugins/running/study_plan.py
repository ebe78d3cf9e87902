"""The plan of ``pml-rank study``: what a study trains, where, and how far it has got.

A study answers "is any method better than the reference, fairly, on this data?" in three
steps: every method tuned with the same trial budget on the config's own split
(``OUT/tune``, ``pml-rank tune``), every tuned setting retrained on ``seeds`` paired seeds on
each of ``splits`` class-disjoint splits (``OUT/split<seed>``, ``pml-rank compare --tuned``; split
``k`` draws its classes with the split function's ``seed`` set to the config's plus ``k``), and
one report over the splits. :class:`StudyPlan` is that design; :func:`claim_out` records it in
``OUT/study_plan.json`` (or, on ``--resume``, checks that the command continues the same study);
:class:`Progress` says how many trainings are done and estimates the time left.

Resume: every step is resumable by itself (``tune`` continues its studies, ``compare --resume``
reuses finished runs and continues interrupted ones), so a killed study continues where it
stopped. What may change on ``--resume``: ``seeds`` and ``splits`` (more or fewer runs and splits;
finished runs are reused). The methods, their configs (the tuning budget), the trial budget and
the reference may not: the runs of the split steps were trained with the settings that budget
chose, and ``compare --resume`` reuses a finished run without looking at its config.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import optuna

from ..experiment import registry
from ..experiment.schema import SPLIT_KEYS, ConfigError, spec_name_and_kwargs
from ..experiment.search_space import tune_section
from ..experiment.tuned import budget_config, config_hash
from .study import counted_trials, default_storage, is_interrupted, make_storage

LOGGER = logging.getLogger(__name__)
PLAN_FILE = "study_plan.json"
PLAN_FORMAT = 1
TUNE_DIR = "tune"
# keys of the plan that may differ on --resume (more or fewer runs and splits)
RESUMABLE = ("seeds", "split_seeds")


@dataclass(frozen=True)
class StudyPlan:
    """One study's design.

    Attributes:
        methods: the methods, in the config's order (the tables' order).
        trials: Optuna trials per method (the equal tuning budget).
        seeds: paired seeds per split (the tuned comparison's ``--seeds``).
        split_key: the key path of the split function's seed (``split.class_disjoint_split.seed``),
            ``None`` for a one-split study.
        split_seeds: the seed of each split; the first is the config's own (tuning's) split.
        reference: the method every other is compared with (chosen before any result).
        budget_hash: the hash of every method's tuning budget (``experiment.tuned``).
    """

    methods: tuple[str, ...]
    trials: int
    seeds: int
    split_key: str | None
    split_seeds: tuple[int, ...]
    reference: str
    budget_hash: str

    @property
    def trainings(self) -> int:
        """Trials plus runs: ``methods x (trials + seeds x splits)``."""
        return len(self.methods) * (self.trials + self.seeds * len(self.split_seeds))

    def split_folder(self, out_dir: str | Path, seed: int) -> Path:
        """``OUT/split<seed>``: the tuned comparison on the split drawn with ``seed``."""
        return Path(out_dir) / f"split{seed}"

    def split_overrides(self, k: int) -> list[str]:
        """The ``--set`` that draws split ``k`` (none for the first, the config's own)."""
        return [] if k == 0 else [f"{self.split_key}={self.split_seeds[k]}"]

    def to_json(self) -> dict:
        return {"format": PLAN_FORMAT, **asdict(self)}


def split_seed_key(configs: Mapping[str, Mapping], splits: int) -> tuple[str | None, int | None]:
    """``(key path, value)`` of the split function's ``seed``, the same for every method;
    ``(None, None)`` for ``splits == 1``. Raises :class:`ConfigError` naming the key when the
    methods' splits differ, the split function takes no ``seed`` (a fixed split: one split
    only) or the seed is not an integer (``None``: classes in sorted order, one partition)."""
    if splits == 1:
        return None, None
    found = set()
    for method, cfg in configs.items():
        split = {k: v for k, v in (cfg.get("split") or {}).items() if k not in SPLIT_KEYS}
        if not split:
            raise ConfigError(f"--splits {splits}: method {method!r} has no split function")
        name, kwargs = spec_name_and_kwargs(split, "split")
        params = inspect.signature(registry.resolve(name, "split")).parameters
        if "seed" not in params:
            raise ConfigError(
                f"--splits {splits}: split.{name} takes no seed, so it has one partition; "
                "use a seeded split (e.g. class_disjoint_split) or --splits 1"
            )
        seed = kwargs.get("seed", params["seed"].default)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(
                f"--splits {splits}: split.{name}.seed is {seed!r}; give an integer seed to draw "
                "other class-disjoint splits"
            )
        found.add((f"split.{name}.seed", seed))
    if len(found) != 1:
        raise ConfigError(f"--splits {splits}: the methods' split seeds differ: {sorted(found)}")
    return next(iter(found))


def make_plan(
    configs: Mapping[str, Mapping],
    trials: int | None,
    seeds: int,
    splits: int,
    reference: str | None = None,
) -> StudyPlan:
    """The plan of a study of ``configs`` (``{method: config}``, validated). ``trials``: per
    method (default: the configs' ``tune.trials``, which must then agree: an equal budget).
    Raises :class:`ConfigError` naming the argument or key."""
    for flag, value in (("--seeds", seeds), ("--splits", splits), ("--trials", trials)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"{flag} must be an integer >= 1, got {value!r}")
    if trials is None:
        budgets = {m: tune_section(c)["trials"] for m, c in configs.items()}
        if len(set(budgets.values())) != 1:
            raise ConfigError(
                f"the methods' tune.trials differ ({budgets}): pass --trials N to give every "
                "method the same tuning budget"
            )
        trials = next(iter(budgets.values()))
    if reference is not None and reference not in configs:
        raise ConfigError(f"--reference {reference!r}: not one of the methods {list(configs)}")
    key, base = split_seed_key(configs, splits)
    hashes = {m: config_hash(budget_config(c)[0]) for m, c in configs.items()}
    return StudyPlan(
        methods=tuple(configs),
        trials=trials,
        seeds=seeds,
        split_key=key,
        split_seeds=tuple(range(base or 0, (base or 0) + splits)),
        reference=reference or next(iter(configs)),
        budget_hash=config_hash(hashes),
    )


def claim_out(out_dir: str | Path, plan: StudyPlan, resume: bool) -> None:
    """Record ``plan`` in ``OUT/study_plan.json``. A folder holding a study is refused without
    ``resume``; with it, the recorded plan must equal ``plan`` except in :data:`RESUMABLE`
    (:class:`ConfigError` naming the keys that differ)."""
    path = Path(out_dir) / PLAN_FILE
    if path.is_file():
        if not resume:
            raise ConfigError(
                f"{out_dir} holds a study ({PLAN_FILE}); pass --resume to continue it, or give "
                "another --out"
            )
        saved = json.loads(path.read_text())
        new = plan.to_json()
        changed = [k for k in new if k not in RESUMABLE and _norm(saved.get(k)) != _norm(new[k])]
        if changed:
            shown = "; ".join(f"{k}: {saved.get(k)!r} -> {new[k]!r}" for k in changed)
            raise ConfigError(
                f"--resume: the study in {out_dir} was planned with other {', '.join(changed)} "
                f"({shown}); only --seeds and --splits may change; study the changed config "
                "into another --out"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{PLAN_FILE}.tmp")
    tmp.write_text(json.dumps(plan.to_json(), indent=2))
    tmp.replace(path)


def _norm(value):
    """JSON's view of a value (tuples as lists), for comparing a plan with its file."""
    return json.loads(json.dumps(value))


class Progress:
    """The progress line of a study: trainings done (trials and runs, read from ``OUT``), the
    elapsed time and an estimate of the time left (:func:`eta_seconds`)."""

    def __init__(self, out_dir: str | Path, plan: StudyPlan, jobs: int = 1) -> None:
        self.out_dir, self.plan, self.jobs = Path(out_dir), plan, jobs
        self.t0 = time.perf_counter()

    def line(self, step: str) -> str:
        """``study [split 1, 3 of 4 steps]: 10 of 20 trainings done (8 trials, 2 runs); 35 s
        elapsed; ETA 40 s``."""
        trials, trial_seconds = trials_done(self.out_dir, self.plan)
        runs, run_seconds = runs_done(self.out_dir, self.plan)
        done = trials + runs
        eta = eta_seconds(trial_seconds + run_seconds, self.plan.trainings - done, self.jobs)
        return (
            f"study [{step}]: {done} of {self.plan.trainings} trainings done ({trials} trials, "
            f"{runs} runs); {format_seconds(time.perf_counter() - self.t0)} elapsed; ETA "
            + ("unknown" if eta is None else format_seconds(eta))
        )

    def log(self, step: str) -> None:
        LOGGER.info("%s", self.line(step))


def trials_done(out_dir: Path, plan: StudyPlan) -> tuple[int, list[float]]:
    """The trials that count toward the budget (at most ``plan.trials`` per method) and the
    seconds of the finished ones (interrupted ones left out), from ``OUT/tune/tune.db`` (none
    before it exists)."""
    db = out_dir / TUNE_DIR / "tune.db"
    if not db.is_file():
        return 0, []
    storage = make_storage(default_storage(out_dir / TUNE_DIR))
    count, seconds = 0, []
    try:
        names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
        for method in plan.methods:
            if method not in names:
                continue
            study = optuna.load_study(study_name=method, storage=storage)
            count += min(plan.trials, counted_trials(study))
            trials = study.get_trials(deepcopy=False)
            # an interrupted trial's end is when a later call marked it, not its work's end
            seconds += [
                t.duration.total_seconds()
                for t in trials
                if t.duration is not None and not is_interrupted(t)
            ]
    finally:
        storage.engine.dispose()
    return count, seconds


def runs_done(out_dir: Path, plan: StudyPlan) -> tuple[int, list[float]]:
    """The runs whose folder holds a ``metrics.json`` (finished or failed: a failed run is
    retried on ``--resume`` but took its time), at most ``methods x seeds`` per split (fewer
    ``--seeds`` on a resume leave runs on disk that the plan does not count), and their wall
    seconds."""
    count, seconds = 0, []
    for seed in plan.split_seeds:
        found = 0
        for metrics in sorted(plan.split_folder(out_dir, seed).glob("*/seed*/metrics.json")):
            m = json.loads(metrics.read_text())
            if m.get("name") in plan.methods:
                found += 1
                if isinstance(m.get("wall_seconds"), (int, float)):
                    seconds.append(float(m["wall_seconds"]))
        count += min(found, len(plan.methods) * plan.seeds)
    return count, seconds


def eta_seconds(seconds: Sequence[float], remaining: int, jobs: int = 1) -> float | None:
    """The time left for ``remaining`` trainings at the mean of ``seconds`` (the finished
    trainings' durations), ``jobs`` at a time: ``ceil(remaining / jobs) * mean``; 0 when nothing
    remains, ``None`` when nothing has finished yet to time it by."""
    if remaining <= 0:
        return 0.0
    if not seconds:
        return None
    return math.ceil(remaining / max(1, jobs)) * sum(seconds) / len(seconds)


def format_seconds(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"2 h 07 min"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
