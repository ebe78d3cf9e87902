"""``pml-rank tune`` end to end on the glyph data with a tiny budget (issue 22)."""

from __future__ import annotations

import json
import logging
import math

import optuna
import pytest
import torch
from optuna.trial import TrialState

from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.methods import collect_methods
from pml_rank_plugins.experiment.schema import ConfigError, deep_merge
from pml_rank_plugins.reporting.tune_report import run_tune
from pml_rank_plugins.running import tune as tuning
from pml_rank_plugins.running.checkpoints import load_checkpoint
from tests.png_plots import use_png_plots_only

GLYPHS = {
    "GlyphDataset": {
        "seed": 0,
        "images_per_class": 6,
        "image_size": 16,
        "max_classes_per_category": 4,
        "categories": ["latin_upper", "digits", "greek_upper"],
    }
}


def glyph_config(epochs: int = 2, **overrides) -> dict:
    """Two methods on 12 glyph classes; a trial trains ``epochs`` x 2 iterations (< 1 s each)."""
    base = {
        "seed": 0,
        "dataset": GLYPHS,
        "split": {
            "class_disjoint_split": {"fractions": [0.5, 0.25, 0.25], "seed": 0},
            "names": ["train", "val", "test"],
        },
        "models": {"trunk": {"ConvEmbedder": {"in_channels": 1, "embedding_dim": 8}}},
        "sampler": {"RandomClassSampler": {"samples_per_class": 3}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}},
        "trainer": {
            "MetricLossOnly": {"batch_size": 12, "iterations_per_epoch": 2, "num_epochs": epochs}
        },
        "eval": {
            "tester": {"GlobalEmbeddingSpaceTester": {"batch_size": 64}},
            "validation": ["val"],
            "test": ["test"],
        },
        "tune": {
            "trials": 3,
            "sampler": {"TPESampler": {"seed": 0}},
            "pruner": None,
            "space": {"optimizers.trunk_optimizer.lr": {"float": [1e-4, 1e-1], "log": True}},
        },
        "methods": {
            "plugin FastAP": {
                "loss_funcs": {"metric_loss": {"pml_rank_plugins.FastAPLoss": {"num_bins": 10}}},
                "tune": {"space": {"loss_funcs.metric_loss.num_bins": {"int": [5, 20]}}},
            },
            "PML Contrastive": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}},
        },
    }
    return deep_merge(base, overrides)


def trials_of(out, method):
    study = optuna.load_study(study_name=method, storage=tuning.default_storage(out))
    return sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)


@pytest.fixture
def workers_in_process(monkeypatch):
    """Run each study's trials in this process instead of in a ``spawn`` worker.

    ``pml-rank tune`` always trains in spawned workers (:func:`tuning._run_workers`); those are
    exercised by the ``jobs=2`` and diverging-trial tests below (the latter also carries a user
    registration into them), tests/running/test_tune_storage.py (PostgreSQL, ``kill -9``) and
    tests/running/test_tune_concurrency.py (``python -m pml_rank_plugins tune`` commands). A
    test about what a study records saves here a fresh Python importing torch per method and
    ``run_tune`` call (about 5 s of CPU each). The worker itself (:func:`tuning._worker`, then
    :func:`tuning.run_trials`) is the real one; the logger levels it sets for its own process
    are put back afterwards.
    """
    loggers = [logging.getLogger(n) for n in ("PML", "pml_rank_plugins.running.training")]
    levels = [logger.level for logger in loggers]

    def in_process(job, jobs):
        assert jobs == 1, "in-process workers run one at a time: use spawn workers for jobs > 1"
        tuning._worker(job, 0, torch.get_num_threads(), {})

    monkeypatch.setattr(tuning, "_run_workers", in_process)
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


@pytest.mark.slow
def test_two_methods_three_trials_then_resume_to_five(tmp_path, workers_in_process, monkeypatch):
    out = tmp_path / "tune"
    summary = run_tune([glyph_config(epochs=1)], out)  # 10 trials in all: one epoch each
    assert set(summary["methods"]) == {"plugin FastAP", "PML Contrastive"}
    for method, s in summary["methods"].items():
        assert s["n_trials"] == 3 and s["states"] == {"complete": 3}
        assert 0 <= s["best_value"] <= 1
        folders = sorted(p.name for p in (out / method.replace(" ", "_")).iterdir())
        assert folders == ["trial0", "trial1", "trial2"]
    fastap = summary["methods"]["plugin FastAP"]["best_params"]
    assert set(fastap) == {"optimizers.trunk_optimizer.lr", "loss_funcs.metric_loss.num_bins"}
    contrastive = summary["methods"]["PML Contrastive"]["best_params"]
    assert set(contrastive) == {"optimizers.trunk_optimizer.lr"}  # the top-level space only
    first = {m: [(t.params, t.value) for t in trials_of(out, m)] for m in summary["methods"]}
    on_disk = json.loads((out / "tune.json").read_text())
    assert (
        on_disk["methods"]["plugin FastAP"]["best_value"]
        == summary["methods"]["plugin FastAP"]["best_value"]
    )
    assert (out / "tune.md").read_text().count("| plugin FastAP |") == 1
    assert (out / "tune_history.png").stat().st_size > 0
    # the study names its objective (optuna-dashboard shows it) and carries its budget
    study = optuna.load_study(study_name="plugin FastAP", storage=tuning.default_storage(out))
    assert study.metric_names == ["validation mean_average_precision_at_r"]
    attrs = study.user_attrs
    assert attrs["objective"] == "validation mean_average_precision_at_r at the best epoch"
    assert attrs["config_hash"] == on_disk["methods"]["plugin FastAP"]["config_hash"]
    assert attrs["config"] == on_disk["methods"]["plugin FastAP"]["config"]
    assert attrs["config"]["trainer"]["MetricLossOnly"]["num_epochs"] == 1

    use_png_plots_only(monkeypatch)  # the outputs were checked above: the study, from here on
    again = run_tune([glyph_config(epochs=1)], out, trials=5)
    for method, s in again["methods"].items():
        assert s["n_trials"] == 5
        trials = trials_of(out, method)
        assert [(t.params, t.value) for t in trials[:3]] == first[method]  # kept, not re-run
        assert s["best_value"] >= summary["methods"][method]["best_value"]
    # the trial config holds the tuned value and no test split (tuning never sees it)
    saved = (out / "plugin_FastAP" / "trial4" / "config.yaml").read_text()
    assert "test: []" in saved
    metrics = json.loads((out / "plugin_FastAP" / "trial4" / "metrics.json").read_text())
    assert metrics["test"] == {} or "test" not in json.dumps(metrics["test"])


@pytest.mark.slow
@pytest.mark.usefixtures("png_plots_only")
def test_jobs_2_on_one_study_gives_exactly_the_trials(tmp_path):
    cfg = glyph_config(
        epochs=1,  # what is under test is how two workers share the study
        methods={"PML Contrastive": {"loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}}},
    )
    cfg["methods"].pop("plugin FastAP")
    summary = run_tune([cfg], tmp_path / "t", trials=4, jobs=2)
    trials = trials_of(tmp_path / "t", "PML Contrastive")
    assert summary["methods"]["PML Contrastive"]["n_trials"] == 4
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({json.dumps(t.params) for t in trials}) == 4


class _DivergingLoss(registry.resolve("ContrastiveLoss")):
    """ContrastiveLoss that returns NaN when ``pos_margin`` is above 0.5 (a diverging setting)."""

    def forward(self, *args, **kwargs):
        loss = super().forward(*args, **kwargs)
        return loss * math.nan if self.pos_margin > 0.5 else loss


@pytest.mark.slow
@pytest.mark.usefixtures("png_plots_only")
def test_a_diverging_trial_is_recorded_failed_and_the_study_finishes(tmp_path):
    registry.register("DivergingLoss", _DivergingLoss, override=True)
    try:
        cfg = glyph_config(epochs=1)
        cfg["methods"] = {"diverging": {"loss_funcs": {"metric_loss": {"DivergingLoss": {}}}}}
        cfg["tune"]["space"] = {"loss_funcs.metric_loss.pos_margin": {"choice": [0.0, 0.9]}}
        cfg["tune"]["sampler"] = {"BruteForceSampler": {"seed": 0}}
        summary = run_tune([cfg], tmp_path / "t", trials=2)
    finally:
        registry.unregister("DivergingLoss")
    s = summary["methods"]["diverging"]
    assert s["states"] == {"complete": 1, "fail": 1}
    failed = [t for t in trials_of(tmp_path / "t", "diverging") if t.state == TrialState.FAIL]
    assert "NonFiniteError" in failed[0].user_attrs["error"]
    run_dir = failed[0].user_attrs["run_dir"]
    assert (
        json.loads((tmp_path / "t" / run_dir.split("/t/")[-1] / "metrics.json").read_text())[
            "status"
        ]
        == "failed"
    )


@pytest.mark.slow
@pytest.mark.usefixtures("png_plots_only")
def test_a_pruned_trial_stops_early(tmp_path, workers_in_process):
    cfg = glyph_config(epochs=4)
    cfg["methods"].pop("plugin FastAP")
    cfg["tune"]["space"] = {"optimizers.trunk_optimizer.lr": {"choice": [0.01, 1e-9]}}
    cfg["tune"]["sampler"] = {"BruteForceSampler": {"seed": 0}}
    # no validation MAP@R reaches 0.99 here: every trial is pruned after its first epoch
    cfg["tune"]["pruner"] = {"ThresholdPruner": {"lower": 0.99, "n_warmup_steps": 0}}
    summary = run_tune([cfg], tmp_path / "t", trials=2)
    assert summary["methods"]["PML Contrastive"]["states"] == {"pruned": 2}
    for t in trials_of(tmp_path / "t", "PML Contrastive"):
        assert list(t.intermediate_values) == [1]  # reported once, then stopped
        run_dir = tmp_path / "t" / "PML_Contrastive" / f"trial{t.number}"
        assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["epoch"] == 1  # not 4
        assert not (run_dir / "metrics.json").exists()


@pytest.mark.parametrize(
    "space, match",
    [
        ({"optimizers.trunk_optimizer.lr": {"float": [1e-2, 1e-4]}}, r"low 0.01 > high 0.0001"),
        (
            {"optimizers.trunk_optimizer.lr": {"float": [0.0, 1e-2], "log": True}},
            "log needs low > 0",
        ),
        ({"optimizers.trunk_optimizer.momentum_x": {"float": [0.0, 1.0]}}, "no such key"),
        ({"trainer.batch_size": {"choice": []}}, "non-empty list"),
        ({"trainer.batch_size": {"int": [2.5, 8]}}, "bounds must be integers"),
        ({"trainer.batch_size": {"range": [2, 8]}}, "give exactly one of"),
    ],
)
def test_a_bad_space_is_a_config_error_naming_the_key(tmp_path, space, match):
    cfg = glyph_config()
    cfg["tune"]["space"] = space
    with pytest.raises(ConfigError, match=match) as info:
        run_tune([cfg], tmp_path / "t")
    assert next(iter(space)) in str(info.value)
    assert not (tmp_path / "t").exists()  # refused before anything trains


def test_jobs_are_capped_at_the_trials_left(tmp_path, monkeypatch):
    # Third audit item 12: `--jobs 8 --trials 1` started 8 workers.
    started = []
    monkeypatch.setattr(tuning, "_run_workers", lambda job, jobs: started.append(jobs))
    configs = collect_methods([glyph_config()], methods=["PML Contrastive"])
    tuning.tune(configs, tmp_path / "t", trials=1, jobs=8)
    assert started == [1]


def _frozen(state: TrialState, **attrs) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        state=state,
        value=0.5 if state == TrialState.COMPLETE else None,
        params={},
        distributions={},
        user_attrs=attrs,
    )


@pytest.mark.parametrize(
    "state, attrs, interrupted",
    [
        (TrialState.COMPLETE, {}, False),
        (TrialState.PRUNED, {}, False),
        (TrialState.FAIL, {"error": "ValueError: loss is nan at step 3"}, False),  # an outcome
        (TrialState.FAIL, {}, True),  # killed before the rule recorded a reason
        (TrialState.FAIL, {"error": "interrupted: session ended"}, True),  # study_snapshot
        (TrialState.FAIL, {"error": "interrupted: its process 12 is gone"}, True),
    ],
)
def test_only_interrupted_trials_do_not_count_toward_the_budget(state, attrs, interrupted):
    assert tuning.is_interrupted(_frozen(state, **attrs)) is interrupted
    study = optuna.create_study(direction="maximize")
    study.add_trial(_frozen(TrialState.COMPLETE))
    study.add_trial(_frozen(state, **attrs))
    assert tuning.counted_trials(study) == (1 if interrupted else 2)
