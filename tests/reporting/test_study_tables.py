"""reporting.study_tables: the Omniglot study's phase tables (tune progress, tuning gain, vs_best,
wall time, claims) from hand-made run folders and Optuna storage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy import stats

from pml_rank_plugins.reporting import study_tables
from pml_rank_plugins.reporting.summary import load_run_dirs, summarize_dir
from tests.reporting.test_convergence import write_curve


def test_main_writes_the_report_from_run_folders(tmp_path):
    for seed, vals in (("seed0", [0.4, 0.5]), ("seed1", [0.45, 0.5])):
        write_curve(tmp_path / "runs" / "probe" / "m" / seed, vals)
    assert study_tables.write_study_tables(str(tmp_path / "runs"), str(tmp_path / "docs")) == 0
    report = json.loads((tmp_path / "docs" / "probe" / "convergence.json").read_text())
    assert report["budget_epochs"] == 2 and report["methods"]["m"]["seeds"] == 2
    assert (tmp_path / "docs" / "probe" / "probe_curves.png").stat().st_size > 0


def test_tune_progress_counts_states_best_and_epochs(tmp_path):
    (tmp_path / "tune").mkdir()
    url = f"sqlite:///{tmp_path / 'tune' / 'tune.db'}"
    study = optuna.create_study(storage=url, study_name="m", direction="maximize")
    for value, epochs in ((0.5, 3), (0.7, 2)):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
        for epoch in range(1, epochs + 1):
            trial.report(value, epoch)
        study.tell(trial, value)
    pruned = study.ask()
    pruned.report(0.1, 1)
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    failed = study.ask()  # failed with an outcome: counts
    failed.set_user_attr("error", "NonFiniteError: loss is nan")
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    killed = study.ask()  # interrupted: recorded failed, does not count
    killed.set_user_attr("error", "interrupted: session ended")
    study.tell(killed, state=optuna.trial.TrialState.FAIL)
    study.ask()  # running
    table = study_tables.tune_progress(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| m |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # trials, complete, pruned, failed, running, interrupted, best, best trial, epochs
    assert cells[1:10] == ["5", "2", "1", "1", "1", "1", "70.00", "1", "6"]
    assert cells[10].startswith("`lr`=")


def test_short_names_keep_a_shared_last_component_apart():
    paths = [
        "optimizers.trunk_optimizer.lr",
        "loss_funcs.metric_loss.margin",
        "mining_funcs.m.margin",
    ]
    assert study_tables.short_names(paths) == {
        paths[0]: "lr",
        paths[1]: "loss_funcs.margin",
        paths[2]: "mining_funcs.margin",
    }


def _write_run(folder: Path, name: str, seed: int, value: float | None) -> None:
    run = folder / name.replace(" ", "_") / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"name: {name}\n")
    test = {} if value is None else {"test": {"mean_average_precision_at_r": value}}
    (run / "metrics.json").write_text(
        json.dumps({"name": name, "status": "finished", "test": test})
    )


def test_tuning_gain_is_the_paired_difference_on_shared_seeds_with_holm(tmp_path):
    tuned, defaults = tmp_path / "tuned", tmp_path / "defaults"
    base = [0.60, 0.62, 0.61, 0.63, 0.59, 0.60]
    bump = [0.02, 0.03, 0.01, 0.02, 0.03, 0.02]
    for seed in range(1, 7):
        _write_run(defaults, "A", seed, base[seed - 1])
        _write_run(tuned, "A", seed, base[seed - 1] + bump[seed - 1])
        _write_run(defaults, "B", seed, base[seed - 1])
        # B: seed 6 only in the defaults, seed 5 failed (no test) when tuned
        if seed < 6:
            _write_run(tuned, "B", seed, None if seed == 5 else base[seed - 1] - 0.01 * seed)
    report = study_tables.tuning_gain(tuned, defaults)
    a, b = report["methods"]["A"], report["methods"]["B"]
    assert a["n"] == 6 and b["n"] == 4 and b["run_ids"] == ["seed1", "seed2", "seed3", "seed4"]
    assert a["gain"]["mean"] == pytest.approx(np.mean(bump))
    d = np.array(bump)
    t = d.mean() / (d.std(ddof=1) / np.sqrt(6))
    p_a = 2 * stats.t.sf(abs(t), 5)  # the paired t-test by hand
    assert a["gain"]["p_ttest"] == pytest.approx(p_a)
    p_b = b["gain"]["p_ttest"]
    assert sorted([a["gain"]["p_ttest_holm"], b["gain"]["p_ttest_holm"]]) == pytest.approx(
        sorted([min(1, 2 * min(p_a, p_b)), max(2 * min(p_a, p_b), max(p_a, p_b))])
    )
    md = study_tables.tuning_gain_markdown(report)
    assert "| A | 6 |" in md and "| B | 4 |" in md and "MAP@R" in md


def test_vs_best_tests_every_method_against_the_highest_mean(tmp_path):
    phase = tmp_path / "tuned"
    values = {
        "A": [0.60, 0.61, 0.59, 0.62, 0.60, 0.61],
        "B": [0.66, 0.68, 0.65, 0.67, 0.66, 0.69],  # the best mean, though not listed first
        "C": [0.64, 0.69, 0.62, 0.66, 0.67, 0.64],
    }
    for name, vs in values.items():
        for seed, v in enumerate(vs, start=1):
            _write_run(phase, name, seed, v)
    before = sorted(p.name for p in phase.iterdir())
    summary = study_tables.vs_best(phase)
    assert summary["reference"] == "B"
    assert sorted(p.name for p in phase.iterdir()) == before  # nothing written into the phase
    primary = "mean_average_precision_at_r"
    for other in ("A", "C"):
        d = np.array(values[other]) - np.array(values["B"])
        row = summary["differences"][other][primary]
        assert row["mean"] == pytest.approx(d.mean())
        assert row["p_ttest"] == pytest.approx(stats.ttest_rel(values[other], values["B"]).pvalue)
    md = study_tables.vs_best_markdown(summary, "tuned")
    assert "**B**" in md and "vs **B**" in md and "| A | 6" in md


def test_best_method_needs_a_finished_run(tmp_path):
    _write_run(tmp_path / "p", "A", 1, None)
    with pytest.raises(ValueError, match="no finished run"):
        study_tables.best_method(load_run_dirs(tmp_path / "p"))


def test_main_reports_gain_and_vs_best_only_for_finished_phases(tmp_path):
    out, docs = tmp_path / "runs", tmp_path / "docs"
    for phase, shift in (("tuned", 0.02), ("defaults", 0.0)):
        for name, base in (("A", 0.60), ("B", 0.65)):
            for seed in range(1, 4):
                _write_run(out / phase, name, seed, base + shift + 0.01 * seed * (name == "A"))
    (out / "probe").mkdir()
    study_tables.write_study_tables(
        str(out), str(docs)
    )  # no probe runs: exit 1, the rest still written
    assert not (docs / "tuning_gain.json").exists()  # neither phase wrote summary.json yet
    assert not (docs / "tuned" / "vs_best.json").exists()
    (out / "tuned" / "summary.json").write_text("{}")
    study_tables.write_study_tables(str(out), str(docs))
    assert json.loads((docs / "tuned" / "vs_best.json").read_text())["reference"] == "B"
    assert not (docs / "tuning_gain.json").exists() and not (docs / "defaults").exists()
    (out / "defaults" / "summary.json").write_text("{}")
    study_tables.write_study_tables(str(out), str(docs))
    gain = json.loads((docs / "tuning_gain.json").read_text())
    assert gain["methods"]["B"]["gain"]["mean"] == pytest.approx(0.02)
    assert "vs **B**" in (docs / "defaults" / "vs_best.md").read_text()


def test_wall_time_sums_the_phases_of_timed_runs_and_counts_reused_ones(tmp_path):
    phase = tmp_path / "runs" / "claims" / "c"
    for seed, (train, reused) in enumerate([(8.0, False), (6.0, False), (99.0, True)], start=1):
        run = phase / "A" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("name: A\n")
        metrics = {
            "name": "A",
            "status": "finished",
            "test": {"test": {"mean_average_precision_at_r": 0.5 + seed / 100}},
            "phase_seconds": {"setup": 0.5, "train": train, "validation": 1.0},
            "wall_seconds": train + 2.0,
        }
        if reused:
            metrics["reused_from"] = "elsewhere"
        (run / "metrics.json").write_text(json.dumps(metrics))
    summary = summarize_dir(phase, write=False)  # what compare writes, plus:
    summary |= {"total_wall_seconds": 20.0, "jobs": 2, "pictures_seconds": 1.0}
    (phase / "summary.json").write_text(json.dumps(summary))
    report = study_tables.wall_time(phase)
    assert report["runs"] == 2 and report["reused_runs"] == 1 and report["untimed_runs"] == 0
    assert report["run_seconds"] == pytest.approx(18.0)  # (8 + 2) + (6 + 2)
    assert report["phase_seconds"]["train"] == pytest.approx(14.0)
    assert report["phase_seconds"]["other"] == pytest.approx(1.0)  # 18 - 14 - 2 x 1.5
    assert report["phase_percent"]["validation"] == pytest.approx(100 * 2 / 18)
    md = study_tables.wall_time_markdown({"claims/c": report})
    assert "| claims/c | 2 (+1) | 18 |" in md and "| 5.00 (1 s) |" in md
    study_tables.write_study_tables(str(tmp_path / "runs"), str(tmp_path / "docs"))
    written = json.loads((tmp_path / "docs" / "wall_time.json").read_text())
    assert list(written) == ["claims/c"]


def test_claims_table_reads_each_finished_claims_summary(tmp_path):
    claim = tmp_path / "runs" / "claims" / "bins"
    ref = [0.60, 0.62, 0.61, 0.63, 0.59, 0.60]
    for seed, r in enumerate(ref, start=1):
        _write_run(claim, "L=41", seed, r)
        _write_run(claim, "L=5", seed, r - 0.03 + 0.001 * seed)
    (tmp_path / "runs" / "claims" / "unfinished" / "x").mkdir(parents=True)  # no summary.json
    assert study_tables.claims_markdown(tmp_path / "runs") is None
    summary = summarize_dir(claim, reference="L=41", write=False)
    (claim / "summary.json").write_text(json.dumps(summary))
    md = study_tables.claims_markdown(tmp_path / "runs")
    assert "### bins (reference: L=41; no equivalence margin)" in md
    assert "unfinished" not in md
    d = summary["differences"]["L=5"]["mean_average_precision_at_r"]
    assert d["mean"] == pytest.approx(-0.03 + 0.0035)
    row = [line for line in md.splitlines() if line.startswith("| L=5 |")][0]
    assert "-2.65 ± " in row and row.endswith(f"| {d['verdict']} |") and d["verdict"] == "lower"
    assert "| L=41 | 6 | 60.83 ± " in md and "(reference)" in md
    study_tables.write_study_tables(str(tmp_path / "runs"), str(tmp_path / "docs"))
    assert (tmp_path / "docs" / "claims.md").read_text() == md
