"""A continued study's sampler does not replay its earlier draws (running/study.py,
``sampler_seed``).

Found in the Omniglot study: ``tune`` continued in a new session re-created TPE with the config's
seed, so its random start-up trials repeated the parameters of the trials drawn before the
interruption (PML MultiSimilarity's trials 6-9 equal trials 0-3). The reproduction below draws
with the tuner's own pieces (``open_study``, the space, ``suggest``), trains nothing, and opens
the study again as a new ``tune`` process does.
"""

from __future__ import annotations

import optuna
import pytest

from pml_rank_plugins.experiment.search_space import check_tune_config, suggest
from pml_rank_plugins.reporting.tune_report import collect_tune_methods
from pml_rank_plugins.running import tune as tuning
from pml_rank_plugins.running.study import TuneJob, sampler_seed
from tests.tiny import tiny_config

METHOD = "tiny"
SPACE = {
    "optimizers.trunk_optimizer.lr": {"float": [1e-4, 1e-1], "log": True},
    "loss_funcs.metric_loss.pos_margin": {"float": [0.0, 0.5]},
}


def make_job(tmp_path, sampler=None) -> TuneJob:
    tune = {"trials": 8, "space": SPACE}
    if sampler is not None:
        tune["sampler"] = sampler
    spec = collect_tune_methods([tiny_config(tune=tune)])[METHOD]
    out = tmp_path / "tune"
    out.mkdir(parents=True, exist_ok=True)
    return TuneJob(METHOD, spec, 8, tuning.default_storage(out), out)


def draw(study: optuna.Study, job: TuneJob, n: int) -> list[dict]:
    """``n`` trials asked, their parameters suggested as ``tune`` does, told a constant."""
    space = check_tune_config(job.config, job.method)
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append({p.path: suggest(trial, p) for p in space.values()})
        study.tell(trial, 0.5)
    return out


def test_a_continued_study_draws_parameters_it_has_not_drawn(tmp_path):
    job = make_job(tmp_path)  # the default sampler: TPESampler(seed=0), 10 random start-up trials
    first = draw(tuning.open_study(job), job, 3)
    later = draw(tuning.open_study(job), job, 3)  # a new `tune` process continues the study
    assert all(p not in first for p in later), (first, later)
    assert len({tuple(sorted(p.items())) for p in first + later}) == 6


def test_continuing_is_reproducible_and_a_fresh_study_keeps_seed_plus_worker(tmp_path):
    a, b = make_job(tmp_path / "a"), make_job(tmp_path / "b")
    draws_a = draw(tuning.open_study(a), a, 2) + draw(tuning.open_study(a), a, 2)
    draws_b = draw(tuning.open_study(b), b, 2) + draw(tuning.open_study(b), b, 2)
    assert draws_a == draws_b
    # a fresh study: worker k draws what TPESampler(seed=seed + k) draws, as before
    fresh = make_job(tmp_path / "c")
    reference = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=1)
    )
    assert draw(tuning.open_study(fresh, worker=1), fresh, 2) == draw(reference, fresh, 2)


def test_sampler_seed_values():
    assert [sampler_seed(7, w, 0) for w in range(3)] == [7, 8, 9]
    continued = {sampler_seed(7, w, n) for w in range(3) for n in range(1, 50)}
    assert len(continued) == 3 * 49  # distinct per (worker, trials so far)
    assert all(0 <= s < 2**32 for s in continued)
    assert sampler_seed(7, 1, 5) == sampler_seed(7, 1, 5)


@pytest.mark.parametrize("sampler", [{"RandomSampler": {}}, {"RandomSampler": {"seed": None}}])
def test_a_sampler_without_an_integer_seed_is_left_as_configured(tmp_path, sampler):
    job = make_job(tmp_path, sampler)
    study = tuning.open_study(job)
    draw(study, job, 1)
    assert type(tuning.open_study(job).sampler) is optuna.samplers.RandomSampler
