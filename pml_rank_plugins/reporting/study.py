"""``pml-rank study``: the fair answer as one resumable command.

Three steps, each one the existing command's machinery, in one ``OUT`` folder
(:mod:`pml_rank_plugins.running.study_plan` holds the plan, the resume rules and the progress
line):

1. ``OUT/tune``: every method tuned with the same number of Optuna trials on the config's own
   split (:func:`.tune_report.run_tune`; the objective is the validation primary metric, the test
   split is never seen);
2. ``OUT/split<seed>`` for each split: every method's tuned setting retrained on ``seeds`` paired
   seeds (:func:`.compare.run_comparison` with ``tuned``); split ``k > 0`` sets the split
   function's seed to the config's plus ``k`` (the only budget change allowed, and recorded);
3. ``OUT/study.md``, ``study.json``, ``across_splits.png``: the per-split and pooled verdicts
   (:mod:`.study_page`).

A progress line (trainings done, elapsed, ETA) is logged before each step and at the end.
``resume``: continue a killed study (the tune continues its studies, ``compare --resume`` reuses
finished runs); without it a folder that holds a study is refused.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..running.study_plan import TUNE_DIR, Progress, StudyPlan, claim_out, make_plan
from .across_splits import split_seed
from .compare import run_comparison
from .study_page import write_study_outputs
from .tune_report import collect_tune_methods, run_tune

LOGGER = logging.getLogger(__name__)


def run_study(
    configs: Sequence[str | Path | Mapping] | Mapping,
    out_dir: str | Path,
    trials: int | None = None,
    seeds: int = 3,
    splits: int = 2,
    jobs: int = 1,
    device: str | None = None,
    resume: bool = False,
    overrides: Iterable[str] = (),
    methods: Sequence[str] | None = None,
    data_root: str | None = None,
    reference: str | None = None,
    pictures: bool = True,
) -> dict:
    """Tune, retrain on ``splits`` class splits x ``seeds`` seeds, and report (module docstring).

    ``configs``: YAML paths and/or dicts, or the CLI's ``{method: RunSpec}`` (collected once).
    ``trials``: per method (default: the configs' ``tune.trials``, which must agree).
    ``reference``: the method the others are compared with (default: the first). Returns
    ``study.json``'s content. Raises ``ConfigError`` (config, plan or resume mistakes, before
    anything trains), ``ValueError`` when a method has no complete trial after the tuning
    (nothing to retrain), and what the steps raise.
    """
    out_dir = Path(out_dir)
    selected = collect_tune_methods(configs, overrides, methods, data_root)
    plan = make_plan(selected, trials, seeds, splits, reference)
    claim_out(out_dir, plan, resume)
    progress, seconds = Progress(out_dir, plan, jobs), {}
    progress.log(f"{TUNE_DIR}, step 1 of {len(plan.split_seeds) + 1}")
    t0 = time.perf_counter()
    _tune_step(selected, out_dir, plan, jobs, device)
    seconds[TUNE_DIR] = time.perf_counter() - t0
    common = dict(data_root=data_root, device=device, jobs=jobs, pictures=pictures)
    summaries = {}
    for k, seed in enumerate(plan.split_seeds):
        progress.log(f"split {seed}, step {k + 2} of {len(plan.split_seeds) + 1}")
        t0 = time.perf_counter()
        summaries[seed] = _split_step(selected, out_dir, plan, k, list(overrides), resume, common)
        seconds[f"split{seed}"] = time.perf_counter() - t0
    report = write_study_outputs(out_dir, plan, summaries, seconds)
    progress.log("done")
    return report


def _tune_step(
    selected: Mapping, out_dir: Path, plan: StudyPlan, jobs: int, device: str | None
) -> None:
    """Tune every method into ``OUT/tune`` (a continued study adds only the missing trials);
    raises ValueError naming the methods without a complete trial (nothing to retrain)."""
    tuned = run_tune(selected, out_dir / TUNE_DIR, trials=plan.trials, jobs=jobs, device=device)
    empty = [m for m, s in tuned["methods"].items() if s["best_params"] is None]
    if empty:  # every trial failed or was pruned: the config needs a fix, not more trials
        raise ValueError(
            f"no complete trial for {empty} after {plan.trials} trial(s) each; see "
            f"{out_dir / TUNE_DIR / 'tune.md'} and the trials' failed.json, fix the config and "
            "study it into another --out"
        )


def _split_step(
    selected: Mapping,
    out_dir: Path,
    plan: StudyPlan,
    k: int,
    overrides: list[str],
    resume: bool,
    common: dict,
) -> dict:
    """The tuned comparison on split ``k`` (``OUT/split<seed>``); returns its summary, checked
    to record that split's seed (a folder named for one split must not hold another's runs)."""
    seed = plan.split_seeds[k]
    folder = plan.split_folder(out_dir, seed)
    summary = run_comparison(
        selected,
        folder,
        seeds=plan.seeds,
        overrides=overrides + plan.split_overrides(k),
        resume=resume,
        reference=plan.reference,
        tuned=out_dir / TUNE_DIR,
        allow_budget_change=k > 0,  # the split's seed: the one key the steps change
        **common,
    )
    if plan.split_key is not None:
        changed = {
            c["key"] for cs in (summary.get("budget_changes") or {}).values() for c in cs
        } - {plan.split_key}
        if changed:  # the user's --set changed the budget on this split only: never silently
            raise ValueError(f"{folder}: the tuned budget changed at {sorted(changed)}")
        split_seed(summary, str(folder / "summary.json"), seed, key=plan.split_key)
    return summary
