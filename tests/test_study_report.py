"""scripts/study_report.py: the convergence probe's budget from hand-made curves, and the
robustness-across-splits tables from synthetic summary.json files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy import stats

from pml_rank_plugins.reporting import statistics as st
from pml_rank_plugins.reporting.summary import summarize
from tests.reporting.statsmodels_holm import holm_by_statsmodels

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("study_report", ROOT / "scripts" / "study_report.py")
study_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_report)


def test_best_so_far_carries_the_best_after_an_early_stop():
    got = study_report.best_so_far([0.1, 0.3, 0.2], 5)
    assert got.tolist() == [0.1, 0.3, 0.3, 0.3, 0.3]


def test_budget_is_where_the_best_methods_mean_comes_within_half_a_point():
    curves = {
        # mean best-so-far: 0.50, 0.60, 0.6075, 0.61, 0.61 -> plateau 0.61, within 0.005 at 3
        "a": {"seed0": [0.5, 0.6, 0.605, 0.61, 0.60], "seed1": [0.5, 0.6, 0.61]},
        "b": {"seed0": [0.2, 0.4, 0.5, 0.55, 0.56]},  # plateau 0.56 < 0.61: not the best curve
    }
    report = study_report.convergence(curves)
    a = report["methods"]["a"]
    assert a["mean_best_so_far"] == pytest.approx([0.5, 0.6, 0.6075, 0.61, 0.61])
    assert a["plateau"] == pytest.approx(0.61) and a["converged_epoch"] == 3
    assert report["methods"]["b"]["converged_epoch"] == 5  # 0.55 < 0.56 - 0.005
    assert report["best_method"] == "a" and report["budget_epochs"] == 3


def _write_curve(run: Path, vals: list[float]) -> None:
    """A finished run of method ``m`` whose validation MAP@R per epoch is ``vals``."""
    run.mkdir(parents=True)
    history = [
        {"epoch": i + 1, "validation": {"val": {"mean_average_precision_at_r": v}}}
        for i, v in enumerate(vals)
    ]
    (run / "metrics.json").write_text(
        json.dumps({"name": "m", "status": "finished", "history": history})
    )


def test_main_writes_the_report_from_run_folders(tmp_path):
    for seed, vals in (("seed0", [0.4, 0.5]), ("seed1", [0.45, 0.5])):
        _write_curve(tmp_path / "runs" / "probe" / "m" / seed, vals)
    assert study_report.main(str(tmp_path / "runs"), str(tmp_path / "docs")) == 0
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
    table = study_report.tune_progress(tmp_path)
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
    assert study_report.short_names(paths) == {
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
    report = study_report.tuning_gain(tuned, defaults)
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
    md = study_report.tuning_gain_markdown(report)
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
    summary = study_report.vs_best(phase)
    assert summary["reference"] == "B"
    assert sorted(p.name for p in phase.iterdir()) == before  # nothing written into the phase
    primary = "mean_average_precision_at_r"
    for other in ("A", "C"):
        d = np.array(values[other]) - np.array(values["B"])
        row = summary["differences"][other][primary]
        assert row["mean"] == pytest.approx(d.mean())
        assert row["p_ttest"] == pytest.approx(stats.ttest_rel(values[other], values["B"]).pvalue)
    md = study_report.vs_best_markdown(summary, "tuned")
    assert "**B**" in md and "vs **B**" in md and "| A | 6" in md


def test_best_method_needs_a_finished_run(tmp_path):
    _write_run(tmp_path / "p", "A", 1, None)
    with pytest.raises(ValueError, match="no finished run"):
        study_report.best_method(study_report.load_run_dirs(tmp_path / "p"))


def test_main_reports_gain_and_vs_best_only_for_finished_phases(tmp_path):
    out, docs = tmp_path / "runs", tmp_path / "docs"
    for phase, shift in (("tuned", 0.02), ("defaults", 0.0)):
        for name, base in (("A", 0.60), ("B", 0.65)):
            for seed in range(1, 4):
                _write_run(out / phase, name, seed, base + shift + 0.01 * seed * (name == "A"))
    (out / "probe").mkdir()
    study_report.main(str(out), str(docs))  # no probe runs: exit 1, the rest still written
    assert not (docs / "tuning_gain.json").exists()  # neither phase wrote summary.json yet
    assert not (docs / "tuned" / "vs_best.json").exists()
    (out / "tuned" / "summary.json").write_text("{}")
    study_report.main(str(out), str(docs))
    assert json.loads((docs / "tuned" / "vs_best.json").read_text())["reference"] == "B"
    assert not (docs / "tuning_gain.json").exists() and not (docs / "defaults").exists()
    (out / "defaults" / "summary.json").write_text("{}")
    study_report.main(str(out), str(docs))
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
    summary = study_report.summarize_dir(phase, write=False)  # what compare writes, plus:
    summary |= {"total_wall_seconds": 20.0, "jobs": 2, "pictures_seconds": 1.0}
    (phase / "summary.json").write_text(json.dumps(summary))
    report = study_report.wall_time(phase)
    assert report["runs"] == 2 and report["reused_runs"] == 1 and report["untimed_runs"] == 0
    assert report["run_seconds"] == pytest.approx(18.0)  # (8 + 2) + (6 + 2)
    assert report["phase_seconds"]["train"] == pytest.approx(14.0)
    assert report["phase_seconds"]["other"] == pytest.approx(1.0)  # 18 - 14 - 2 x 1.5
    assert report["phase_percent"]["validation"] == pytest.approx(100 * 2 / 18)
    md = study_report.wall_time_markdown({"claims/c": report})
    assert "| claims/c | 2 (+1) | 18 |" in md and "| 5.00 (1 s) |" in md
    study_report.main(str(tmp_path / "runs"), str(tmp_path / "docs"))
    written = json.loads((tmp_path / "docs" / "wall_time.json").read_text())
    assert list(written) == ["claims/c"]


def test_convergence_check_measures_the_late_gain_and_late_bests(tmp_path):
    late = study_report.LATE
    curves = {
        "seed1": [0.5] * 10 + [0.6] * (late - 1) + [0.62],  # still rising: best at the end
        "seed2": [0.5] * 5 + [0.7] * (late + 5),  # flat since epoch 6
    }
    for seed, vals in curves.items():
        _write_curve(tmp_path / "tuned" / "m" / seed, vals)
    report = study_report.convergence_check(tmp_path / "tuned")
    m = report["methods"]["m"]
    # mean best-so-far: end (0.62 + 0.7) / 2, LATE epochs before (0.5 + 0.7) / 2
    assert m["late_gain"] == pytest.approx(0.06) and m["best_in_late"] == 1
    md = study_report.convergence_check_markdown(report)
    assert f"| m | 2 | 66.00 | {10 + late} | 6.00 | 1 |" in md


def test_claims_table_reads_each_finished_claims_summary(tmp_path):
    claim = tmp_path / "runs" / "claims" / "bins"
    ref = [0.60, 0.62, 0.61, 0.63, 0.59, 0.60]
    for seed, r in enumerate(ref, start=1):
        _write_run(claim, "L=41", seed, r)
        _write_run(claim, "L=5", seed, r - 0.03 + 0.001 * seed)
    (tmp_path / "runs" / "claims" / "unfinished" / "x").mkdir(parents=True)  # no summary.json
    assert study_report.claims_markdown(tmp_path / "runs") is None
    summary = study_report.summarize_dir(claim, reference="L=41", write=False)
    (claim / "summary.json").write_text(json.dumps(summary))
    md = study_report.claims_markdown(tmp_path / "runs")
    assert "### bins (reference: L=41; no equivalence margin)" in md
    assert "unfinished" not in md
    d = summary["differences"]["L=5"]["mean_average_precision_at_r"]
    assert d["mean"] == pytest.approx(-0.03 + 0.0035)
    row = [line for line in md.splitlines() if line.startswith("| L=5 |")][0]
    assert "-2.65 ± " in row and row.endswith(f"| {d['verdict']} |") and d["verdict"] == "lower"
    assert "| L=41 | 6 | 60.83 ± " in md and "(reference)" in md
    study_report.main(str(tmp_path / "runs"), str(tmp_path / "docs"))
    assert (tmp_path / "docs" / "claims.md").read_text() == md


# ---- robustness across splits (issue 42) ----

PRIMARY = "mean_average_precision_at_r"


def _results(values: dict[str, list[float]], first_seed: int = 1) -> dict:
    """``{method: {run_id: metrics.json}}`` of finished runs with test MAP@R ``values``."""
    return {
        name: {
            f"seed{first_seed + i}": {
                "name": name,
                "status": "finished",
                "test": {"test": {PRIMARY: v}},
                "wall_seconds": 100.0,
            }
            for i, v in enumerate(vs)
        }
        for name, vs in values.items()
    }


def _split_summary(values: dict[str, list[float]], split: int, first_seed: int = 1) -> dict:
    """A ``summary.json`` as ``compare --tuned ... --set split...seed=k --allow-budget-change``
    writes it (``reporting.summary.summarize`` plus the command's record) for test MAP@R
    ``values[method]`` on seeds ``first_seed, first_seed + 1, ...``."""
    results = _results(values, first_seed)
    summary = summarize(results, reference=next(iter(values)), primary=PRIMARY, margin=1.0)
    n = max(len(v) for v in values.values())
    summary |= {"total_wall_seconds": 50.0 * n * len(values), "seeds": n, "jobs": 2}
    key = study_report.SPLIT_KEY
    summary["budget_changes"] = (
        {m: [{"key": key, "tuned": 0, "used": split, "set": key}] for m in values} if split else {}
    )
    return json.loads(json.dumps(summary))  # as read back from the file


def _synthetic_splits(rng: np.random.Generator) -> dict[int, dict[str, list[float]]]:
    """Four splits (0: 10 seeds, 1-3: 5): A trails the reference by about 5 points on every
    split, B leads by 3 on split 0 and trails by 3 on the others, C is noise."""
    out = {}
    for split, n in ((0, 10), (1, 5), (2, 5), (3, 5)):
        ref = 0.70 + 0.02 * rng.standard_normal(n)
        out[split] = {
            "first": 0.60 + 0.02 * rng.standard_normal(n),  # compare's reference, not the study's
            "ref": ref,
            "A": ref - 0.05 - 0.01 * split + 0.005 * rng.standard_normal(n),
            "B": ref + (0.03 if split == 0 else -0.03) + 0.005 * rng.standard_normal(n),
            "C": ref + 0.01 * rng.standard_normal(n),
        }
    return {s: {k: list(v) for k, v in vals.items()} for s, vals in out.items()}


def _dl_hksj(y: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    """Random-effects mean, modified-HKSJ 95% half-width and p, written out (DerSimonian-Laird
    tau^2 truncated at 0; Hartung-Knapp scale max(1, q); t on k - 1 df)."""
    k, w = len(y), 1 / v
    q = (w * (y - (w * y).sum() / w.sum()) ** 2).sum()
    tau2 = max(0.0, (q - (k - 1)) / (w.sum() - (w**2).sum() / w.sum()))
    ws = 1 / (v + tau2)
    mu = (ws * y).sum() / ws.sum()
    se = np.sqrt(max(1.0, (ws * (y - mu) ** 2).sum() / (k - 1)) / ws.sum())
    return mu, stats.t.ppf(0.975, k - 1) * se, 2 * stats.t.sf(abs(mu / se), k - 1)


def test_across_splits_pools_the_splits_and_tells_what_holds(tmp_path):
    values = _synthetic_splits(np.random.default_rng(4))
    summaries = {s: _split_summary(v, s) for s, v in values.items()}
    report = study_report.across_splits(summaries, "ref")
    assert list(report["rows"]) == ["first", "A", "B", "C"]
    assert report["splits"]["0"]["n_seeds"] == 10 and report["splits"]["3"]["n_seeds"] == 5
    # split 0 pools seeds 1-5 (the other splits' seeds); its verdict uses all 10
    assert report["pooled_run_ids"]["0"] == [f"seed{i}" for i in range(1, 6)]
    pooled = {}
    for name in ("first", "A", "B", "C"):
        y, v = [], []
        for vals in values.values():
            d = np.array(vals[name][:5]) - np.array(vals["ref"][:5])
            y.append(d.mean())
            v.append(d.var(ddof=1) / 5)
        pooled[name] = _dl_hksj(np.array(y), np.array(v))
    for name, (mu, half, p) in pooled.items():
        got = report["rows"][name]["pooled"]
        assert got["mean"] == pytest.approx(mu, rel=1e-10)
        assert got["ci_half_width"] == pytest.approx(half, rel=1e-9)
        assert got["p"] == pytest.approx(p, rel=1e-8)
    names = list(pooled)
    holm = holm_by_statsmodels([pooled[n][2] for n in names])
    for name, adjusted in zip(names, holm):
        assert report["rows"][name]["pooled"]["p_holm"] == pytest.approx(adjusted, rel=1e-9)
    a, b, c = (report["rows"][n] for n in "ABC")
    assert a["holds"] is True and a["same_direction"] and a["pooled"]["mean"] < 0
    assert b["holds"] is False and not b["same_direction"]
    assert b["splits"]["0"]["mean"] > 0 and b["splits"]["1"]["mean"] < 0
    assert c["holds"] is False
    # the split-0 verdict is the study's: every seed, Holm over that split's table
    study = summarize(_results(values[0]), reference="ref", primary=PRIMARY, margin=1.0)
    for name in ("A", "B", "C"):
        expected = study["differences"][name][PRIMARY]
        assert (
            a is not None and report["rows"][name]["splits"]["0"]["verdict"] == expected["verdict"]
        )
        assert report["rows"][name]["splits"]["0"]["n"] == 10
    assert b["splits"]["0"]["verdict"] == "higher" and a["splits"]["2"]["verdict"] == "lower"
    table = study_report.across_splits_table(report, "method")
    row_a = next(line for line in table.splitlines() if line.startswith("| A |"))
    row_b = next(line for line in table.splitlines() if line.startswith("| B |"))
    assert row_a.endswith("| **yes (lower)** |")
    assert row_b.endswith("| no: direction differs (0 +, 1 -, 2 -, 3 -) |")
    assert "split 0 (study), n = 10" in table and "split 3, n = 5" in table
    text = study_report.across_splits_sentences(report, "method")
    assert "**Holds across splits 0, 1, 2 and 3:** first and A score lower than ref" in text
    assert "B (higher on split 0)" in text and "**Split-specific:**" in text


def test_split_specific_names_the_other_splits_that_decided_the_same_direction():
    # D trails by about 5 points on both splits, each split's test decides "lower", but the
    # pooled test over two splits (1 degree of freedom) is not significant: the sentence says
    # the direction was decided on split 1 too; E is lower on split 0 only.
    rng = np.random.default_rng(7)
    values = {}
    for split, n in ((0, 10), (1, 5)):
        ref = 0.70 + 0.02 * rng.standard_normal(n)
        values[split] = {
            "ref": list(ref),
            "D": list(ref - 0.05 + 0.02 * rng.standard_normal(n)),
            "E": list(ref - (0.05 if split == 0 else 0.0) + 0.005 * rng.standard_normal(n)),
        }
    report = study_report.across_splits({s: _split_summary(v, s) for s, v in values.items()}, "ref")
    d, e = report["rows"]["D"], report["rows"]["E"]
    assert d["splits"]["0"]["verdict"] == "lower" and d["splits"]["1"]["verdict"] == "lower"
    assert d["holds"] is False and d["pooled"]["p_holm"] >= 0.05
    assert e["splits"]["0"]["verdict"] == "lower" and e["splits"]["1"]["verdict"] != "lower"
    text = study_report.across_splits_sentences(report, "setting")
    assert (
        "**Split-specific:** D (lower on split 0; also lower on split 1) and E (lower on split 0):"
        in text
    )
    # F trails on both splits, decided on split 0 only: the shared sign is named, no verdict
    values[0]["F"] = list(np.array(values[0]["ref"]) - 0.05 + 0.005 * rng.standard_normal(10))
    values[1]["F"] = list(np.array(values[1]["ref"]) - 0.01 + 0.03 * np.array([1, -1, 1, -1, 0]))
    report = study_report.across_splits({s: _split_summary(v, s) for s, v in values.items()}, "ref")
    f = report["rows"]["F"]
    assert f["splits"]["0"]["verdict"] == "lower" and f["splits"]["1"]["verdict"] != "lower"
    assert f["same_direction"] and not f["holds"]
    text = study_report.across_splits_sentences(report, "setting")
    assert "F (lower on split 0; the same sign on every split)" in text


def test_across_splits_with_the_study_split_alone_tests_nothing():
    values = _synthetic_splits(np.random.default_rng(5))
    report = study_report.across_splits({0: _split_summary(values[0], 0)}, "ref")
    assert all(r["pooled"] is None and r["holds"] is False for r in report["rows"].values())
    text = study_report.across_splits_sentences(report, "method")
    assert text.startswith("Only split 0 has finished")
    assert "not tested" in study_report.across_splits_table(report, "method")


def test_a_summary_recording_another_split_is_refused():
    values = _synthetic_splits(np.random.default_rng(6))
    summary = _split_summary(values[2], 2)
    assert study_report.split_seed(summary, "x/seed2/summary.json", 2) == 2
    with pytest.raises(
        ValueError, match=r"x/seed1/summary.json: records .*seed = \[2\], expected 1"
    ):
        study_report.split_seed(summary, "x/seed1/summary.json", 1)


def _write_split_docs(docs: Path, values: dict, claims: dict | None = None) -> None:
    for split, vals in values.items():
        folder = docs / ("tuned" if split == 0 else f"splits/seed{split}")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps(_split_summary(vals, split)))
    (docs / "tuned" / "vs_best.json").write_text(json.dumps({"reference": "ref"}))
    for claim, by_split in (claims or {}).items():
        for split, vals in by_split.items():
            folder = docs / ("claims" if split == 0 else f"splits/claims{split}") / claim
            folder.mkdir(parents=True, exist_ok=True)
            summary = _split_summary(vals, 0)  # a claim's --set is not recorded
            (folder / "summary.json").write_text(json.dumps(summary))


def _claim_splits(values: dict, rng: np.random.Generator, reference: str, shifts: dict) -> dict:
    """A claim's test MAP@R per split: ``reference`` is the split's ``"ref"`` row, each other
    setting that row shifted by ``shifts[name]`` plus noise (sd 0.01)."""
    return {
        s: {
            reference: v["ref"],
            **{
                name: list(np.array(v["ref"]) + shift + 0.01 * rng.standard_normal(len(v["ref"])))
                for name, shift in shifts.items()
            },
        }
        for s, v in values.items()
    }


def test_splits_main_fills_the_pages_regions_and_lists_missing_steps(tmp_path):
    rng = np.random.default_rng(7)
    values = _synthetic_splits(rng)
    claim = _claim_splits(values, rng, "tuned", {"m=0": -0.07})
    docs = tmp_path / "docs" / "study"
    _write_split_docs(
        docs, {0: values[0], 1: values[1]}, {"rll_margin_tn": {0: claim[0], 1: claim[1]}}
    )
    page = tmp_path / "results.md"
    regions = "".join(
        f"text before {name}\n{b}\nSTALE TEXT\n{e}\n"
        for name in ("methods", "claims", "compute")
        for b, e in [study_report.region_markers(name)]
    )
    page.write_text("# Results\n" + regions + "after\n")
    assert study_report.splits_main(str(docs), str(page)) == 0
    text = page.read_text()
    assert "STALE TEXT" not in text and text.startswith("# Results\ntext before methods\n")
    assert text.endswith("after\n") and text.count("<!-- generated by") == 3
    assert "| A | " in text and "#### rll_margin_tn (reference: tuned)" in text
    assert "| m=0 | " in text
    assert "Split 1's 34 test characters hold" in text
    assert "| seed1 | 1 | 5 x 5 | 25 (0 failed) | 2,500 |" in text
    assert "**Not finished when this was generated:** seed2, claims1/batch_size, seed3" in text
    assert study_report.RESUME_COMMAND in text and study_report.REPORT_COMMAND in text
    report = json.loads((docs / "splits" / "robustness.json").read_text())
    assert list(report["methods"]["splits"]) == ["0", "1"]
    assert list(report["claims"]) == ["rll_margin_tn"]
    again = page.read_text()
    study_report.splits_main(str(docs), str(page))  # idempotent
    assert page.read_text() == again
    page.write_text("# Results without regions\n")
    with pytest.raises(ValueError, match="no region"):
        study_report.splits_main(str(docs), str(page))


def test_a_step_published_with_fewer_rows_is_not_finished_and_its_rows_say_not_run(tmp_path):
    # claim batch_size on split 1 published from `compare --methods` without "M=320": the
    # compute table says 2 of 3 rows and lists the step as not finished, naming the row; the
    # claims table shows "not run" for it on split 1 and does not pool it.
    rng = np.random.default_rng(9)
    values = _synthetic_splits(rng)
    claim = _claim_splits(values, rng, "M=80", {"M=40": -0.07, "M=320": 0.0})
    claim[1].pop("M=320")
    docs = tmp_path / "docs" / "study"
    _write_split_docs(
        docs, {0: values[0], 1: values[1]}, {"batch_size": {0: claim[0], 1: claim[1]}}
    )
    sections = study_report.splits_markdown(docs)
    assert "| claims1/batch_size | 1 | 2 of 3 x 5 | 10 (0 failed) |" in sections["compute"]
    assert "claims1/batch_size (not run yet: M=320)" in sections["compute"]
    assert "**Every step has finished.**" not in sections["compute"]
    row = next(x for x in sections["claims"].splitlines() if x.startswith("| M=320 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "not run" and cells[3] == "-"
    assert cells[-1] == "not tested (a split lacks the row, or the spread of its differences)"
    m40 = next(x for x in sections["claims"].splitlines() if x.startswith("| M=40 |"))
    assert "not run" not in m40 and "(τ" in m40


def test_the_simulations_pooled_test_is_random_effects_mean():
    rng = np.random.default_rng(8)
    y, v = rng.normal(0, 0.03, (6, 3)), rng.uniform(1e-5, 4e-4, (6, 3))
    got = study_report.random_effects_p(y, v)
    for i in range(6):
        assert got[i] == pytest.approx(st.random_effects_mean(y[i], v[i])["p"], rel=1e-9)


def test_level_simulation_shows_the_blocked_test_overrejecting_under_heterogeneity():
    level = study_report.level_simulation([3], tau=0.02, sd=0.02, draws=2000, seed=1)
    assert level[3]["blocked"] > 0.2 and level[3]["random_effects"] < 0.07
    calm = study_report.level_simulation([3], tau=0.0, sd=0.02, draws=2000, seed=1)
    assert abs(calm[3]["blocked"] - 0.05) < 0.02  # the blocked test is exact without a spread


def test_split_overlap_counts_every_character_once():
    overlap = study_report.split_overlap(1)
    sizes = {"train": 68, "val": 34, "test": 34}
    for part, counts in overlap.items():
        assert sum(counts.values()) == sizes[part]
    for part in sizes:
        assert sum(o[part] for o in overlap.values()) == sizes[part]
    assert study_report.split_overlap(0)["val"] == {"train": 0, "val": 34, "test": 0}


def test_the_results_page_shows_what_the_committed_split_outputs_give():
    """docs/results.md's generated regions equal what `study_report.py splits` makes of the
    committed docs/study files; after publishing a new split step, regenerate with
    ``python scripts/study_report.py splits docs/study docs/results.md``."""
    sections = study_report.splits_markdown(ROOT / "docs" / "study")
    sections.pop("report")
    page = (ROOT / "docs" / "results.md").read_text()
    assert study_report.fill_regions(page, sections) == page, study_report.REPORT_COMMAND
