"""running.study_plan: the design of ``pml-rank study`` (split seeds, the equal trial budget), its
resume rules (``study_plan.json``), the trainings counted from ``OUT`` and the ETA."""

from __future__ import annotations

import json

import optuna
import pytest

from pml_rank_plugins.experiment.schema import ConfigError, deep_merge
from pml_rank_plugins.running import study_plan
from pml_rank_plugins.running.study_plan import (
    PLAN_FILE,
    claim_out,
    eta_seconds,
    format_seconds,
    make_plan,
    runs_done,
)
from tests.tiny import tiny_config


def configs(**per_method) -> dict:
    """``{method: tiny config}``; ``per_method[m]``: overrides of method ``m``."""
    base = {
        "tune": {"trials": 3, "space": {"optimizers.trunk_optimizer.lr": {"float": [0.001, 0.1]}}}
    }
    return {m: deep_merge(tiny_config(**base), per_method.get(m) or {}) for m in ("a", "b")}


def test_the_plan_draws_split_k_with_the_configs_split_seed_plus_k():
    cfgs = configs(a={"split": {"class_disjoint_split": {"seed": 5}}},
                   b={"split": {"class_disjoint_split": {"seed": 5}}})  # fmt: skip
    plan = make_plan(cfgs, None, seeds=2, splits=3)
    assert plan.split_key == "split.class_disjoint_split.seed"
    assert plan.split_seeds == (5, 6, 7) and plan.trials == 3 and plan.reference == "a"
    assert plan.split_overrides(0) == [] and plan.split_overrides(2) == [
        "split.class_disjoint_split.seed=7"
    ]
    assert plan.trainings == 2 * (3 + 2 * 3)
    assert plan.split_folder("o", 6).as_posix() == "o/split6"
    # one split: no key needed, the config's own split (its seed, or 0 by default) only
    one = make_plan(configs(), 4, seeds=1, splits=1, reference="b")
    assert one.split_key is None and one.split_seeds == (0,) and one.trials == 4
    assert one.reference == "b"


def test_an_equal_budget_is_required():
    cfgs = configs(b={"tune": {"trials": 5}})
    with pytest.raises(ConfigError, match=r"tune.trials differ \(\{'a': 3, 'b': 5\}\).*--trials"):
        make_plan(cfgs, None, seeds=2, splits=2)
    assert make_plan(cfgs, 4, seeds=2, splits=2).trials == 4  # --trials gives both the same


@pytest.mark.parametrize(
    "split, match",
    [
        ({"first_half_split": {}, "names": ["train", "test"]}, "split.first_half_split takes no seed"),
        ({"class_disjoint_split": {"fractions": [0.5, 0.5], "seed": None},
          "names": ["train", "test"]}, r"split.class_disjoint_split.seed is None"),
    ],
)  # fmt: skip
def test_more_splits_need_a_seeded_split_function(split, match):
    cfgs = {m: {**c, "split": split} for m, c in configs().items()}
    with pytest.raises(ConfigError, match=match):
        make_plan(cfgs, None, seeds=2, splits=2)
    assert make_plan(cfgs, None, seeds=2, splits=1).split_seeds == (0,)


def test_the_methods_must_share_their_split_seed():
    cfgs = configs(b={"split": {"class_disjoint_split": {"seed": 1}}})
    with pytest.raises(ConfigError, match="split seeds differ"):
        make_plan(cfgs, None, seeds=2, splits=2)


@pytest.mark.parametrize("flag, kwargs", [("--seeds", {"seeds": 0}), ("--splits", {"splits": True}),
                                          ("--trials", {"trials": 0})])  # fmt: skip
def test_bad_counts_and_references_are_refused(flag, kwargs):
    args = {"trials": None, "seeds": 2, "splits": 2} | kwargs
    with pytest.raises(ConfigError, match=f"{flag} must be an integer >= 1"):
        make_plan(configs(), **args)
    with pytest.raises(ConfigError, match=r"--reference 'c': not one of the methods \['a', 'b'\]"):
        make_plan(configs(), None, 2, 2, reference="c")


def test_a_study_folder_is_claimed_once_and_resumed_with_the_same_budget(tmp_path):
    plan = make_plan(configs(), None, seeds=2, splits=2)
    claim_out(tmp_path, plan, resume=False)
    saved = json.loads((tmp_path / PLAN_FILE).read_text())
    assert saved["format"] == 1 and saved["split_seeds"] == [0, 1] and saved["trials"] == 3
    with pytest.raises(ConfigError, match=r"holds a study \(study_plan.json\); pass --resume"):
        claim_out(tmp_path, plan, resume=False)
    more = make_plan(configs(), None, seeds=4, splits=3)  # more seeds and splits: continued
    claim_out(tmp_path, more, resume=True)
    assert json.loads((tmp_path / PLAN_FILE).read_text())["split_seeds"] == [0, 1, 2]
    for changed, key in [
        (make_plan(configs(), 5, seeds=4, splits=3), "trials"),
        (make_plan(configs(), None, seeds=4, splits=3, reference="b"), "reference"),
        (make_plan(configs(a={"trainer": {"MetricLossOnly": {"num_epochs": 3}}}), None, 4, 3),
         "budget_hash"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=f"planned with other {key} .*only --seeds and"):
            claim_out(tmp_path, changed, resume=True)
    assert json.loads((tmp_path / PLAN_FILE).read_text()) == more.to_json() | {
        "methods": ["a", "b"],
        "split_seeds": [0, 1, 2],
    }


def test_runs_are_counted_per_split_up_to_the_plan(tmp_path):
    plan = make_plan(configs(), None, seeds=1, splits=2)  # 2 runs per split
    for split, run, name, seconds in [
        (0, "seed1", "a", 2.0),
        (0, "seed1", "b", 4.0),
        (0, "seed2", "a", 6.0),  # a seed the plan no longer counts (fewer --seeds on a resume)
        (1, "seed1", "z", 1.0),  # not a method of the study
    ]:
        folder = tmp_path / f"split{split}" / name / run
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"name": name, "wall_seconds": seconds}))
    count, seconds = runs_done(tmp_path, plan)
    assert count == 2 and sorted(seconds) == [2.0, 4.0, 6.0]
    assert study_plan.trials_done(tmp_path, plan) == (0, [])  # no tune.db yet


def test_eta_is_the_mean_training_time_times_the_rounds_left():
    assert eta_seconds([10.0, 20.0], remaining=5, jobs=2) == 3 * 15.0  # ceil(5 / 2) rounds
    assert eta_seconds([10.0], remaining=5, jobs=1) == 50.0
    assert eta_seconds([], remaining=5) is None and eta_seconds([], remaining=0) == 0.0
    assert [format_seconds(s) for s in (42.4, 185, 7620)] == ["42 s", "3 min 05 s", "2 h 07 min"]


def test_trials_are_counted_from_the_storage_without_the_interrupted_ones(tmp_path):
    plan = make_plan(configs(), 2, seeds=1, splits=1)  # 2 trials per method
    (tmp_path / "tune").mkdir()
    url = f"sqlite:///{tmp_path / 'tune' / 'tune.db'}"
    for method, outcomes in (("a", ["done", "interrupted", "done", "done"]), ("b", ["done"])):
        study = optuna.create_study(storage=url, study_name=method, direction="maximize")
        for outcome in outcomes:
            trial = study.ask()
            if outcome == "interrupted":  # as tune marks a trial whose process died
                trial.set_user_attr("error", "interrupted: its process 1 is gone")
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, 0.5)
    count, seconds = study_plan.trials_done(tmp_path, plan)
    # a: 3 that count, capped at the plan's 2, and b's 1; timed: the 4 that were not interrupted
    assert count == 3 and len(seconds) == 4 and all(s >= 0 for s in seconds)
