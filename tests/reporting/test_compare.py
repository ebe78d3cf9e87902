"""``compare``: fault isolation, fail-fast config errors, CSV = Markdown, re-summarizing from run
folders, ``--reference``, config dicts and ``--jobs 2`` = ``--jobs 1`` (tiny stand-in budget).

One finished comparison (two methods x two seeds, :func:`finished`) is trained once per module and
shared: tests that change its folder work on a copy. No test here reads a plot's PDF copy, so the
comparisons written in this process draw PNGs only (``tests/png_plots.py``); the failed-run test
writes its plots through the CLI as users get them."""

from __future__ import annotations

import copy
import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss

from pml_rank_plugins import reporting
from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.reporting import compare
from pml_rank_plugins.running import RunFolderError, runner
from tests.png_plots import use_png_plots_only
from tests.tiny import tiny_config

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("compare_finished")


class CrashingLoss(ContrastiveLoss):
    """PML's ContrastiveLoss that raises on its ``crash_at``-th call (a bug in a loss)."""

    def __init__(self, crash_at: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.crash_at, self.calls = crash_at, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.crash_at:
            raise RuntimeError("boom: simulated crash inside the loss")
        return super().forward(*args, **kwargs)


class NeedsPositiveLoss(ContrastiveLoss):
    def __init__(self, scale: float = 1.0, **kwargs):
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        super().__init__(**kwargs)


registry.register("CrashingLoss", CrashingLoss, override=True)
registry.register("NeedsPositiveLoss", NeedsPositiveLoss, override=True)

FAST = ["--set", "trainer.iterations_per_epoch=2", "--set", "trainer.num_epochs=1"]


def two_methods(**extra) -> dict:
    cfg = tiny_config()
    cfg["methods"] = {
        "Contrastive": None,
        "MultiSimilarity": {"loss_funcs": {"metric_loss": {"MultiSimilarityLoss": {}}}},
        **extra,
    }
    return cfg


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "two.yaml"
    dump_yaml(two_methods(), path)
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    """``compare`` of :func:`two_methods` with 2 seeds, ``--reference MultiSimilarity``, no
    retrieval pictures (no test here reads them; tests/reporting/test_retrieval.py draws them):
    its folder and summary, trained once for the module (read it, or copy it first)."""
    base = tmp_path_factory.mktemp("finished")
    dump_yaml(two_methods(), base / "two.yaml")
    with pytest.MonkeyPatch.context() as mp:
        use_png_plots_only(mp)
        summary = compare.run_comparison(
            base / "two.yaml",
            base / "cmp",
            seeds=2,
            overrides=FAST[1::2],
            reference="MultiSimilarity",
            pictures=False,
        )
    return base / "cmp", summary


def copy_of(finished: tuple[Path, dict], out: Path) -> tuple[Path, dict]:
    """The :func:`finished` comparison copied to ``out``, with a copy of its summary."""
    shutil.copytree(finished[0], out)
    return out, copy.deepcopy(finished[1])


@pytest.mark.slow
def test_failed_run_is_reported_and_the_others_complete(tmp_path, capsys):
    path = tmp_path / "crash.yaml"
    dump_yaml(two_methods(Crashing={"loss_funcs": {"metric_loss": {"CrashingLoss": {}}}}), path)
    out = tmp_path / "cmp"
    # --no-pictures: the retrieval pictures are drawn after the runs and are not checked here
    rc = main(["compare", str(path), "--seeds", "2", "--out", str(out), "--no-pictures"] + FAST)
    assert rc == 1  # non-zero at the end, after every other run finished
    captured = capsys.readouterr()
    assert "2 run(s) failed" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert [(f["method"], f["run_id"]) for f in summary["failed"]] == [
        ("Crashing", "seed0"),
        ("Crashing", "seed1"),
    ]
    assert "RuntimeError: boom" in summary["failed"][0]["error"]
    assert summary["rows"]["Crashing"]["n_failed"] == 2
    for m in ("Contrastive", "MultiSimilarity"):
        assert summary["rows"][m]["mean_average_precision_at_r"]["n"] == 2
        assert (out / m / "seed1" / "metrics.json").is_file()
    failed = json.loads((out / "Crashing" / "seed0" / "failed.json").read_text())
    assert "boom" in failed["error"] and "Traceback" in failed["traceback"]
    table = (out / "comparison.md").read_text()
    assert "| Crashing | 0 (2 failed) | failed: RuntimeError: boom" in table
    assert "- Crashing / seed1: RuntimeError: boom" in table
    rows = {r["method"]: r for r in csv.DictReader(open(out / "comparison.csv"))}
    assert rows["Crashing"]["n_failed"] == "2" and "boom" in rows["Crashing"]["errors"]
    # --resume retries only the failed runs (here: they fail again) and keeps the finished ones.
    finished = (out / "Contrastive" / "seed0" / "metrics.json").stat().st_mtime_ns
    again = ["compare", str(path), "--seeds", "2", "--out", str(out), "--resume", "--no-pictures"]
    assert main(again + FAST) == 1
    assert (out / "Contrastive" / "seed0" / "metrics.json").stat().st_mtime_ns == finished


def test_config_errors_stop_everything_before_the_first_run(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    bad = {"loss_funcs": {"metric_loss": {"NeedsPositiveLoss": {"scale": -1.0}}}}
    dump_yaml(two_methods(Bad=bad), path)
    out = tmp_path / "cmp"
    assert main(["compare", str(path), "--out", str(out)] + FAST) == 2
    err = capsys.readouterr().err
    assert "method 'Bad'" in err and "scale must be > 0" in err
    assert not (out / "Contrastive").exists()  # nothing trained
    assert main(["compare", str(path), "--out", str(out), "--reference", "Nope"] + FAST) == 2
    assert "--reference 'Nope'" in capsys.readouterr().err


def _markdown_rows(text: str) -> dict[str, list[str]]:
    table = text.split("\n\n")[0].splitlines()
    return {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in table[2:])}


@pytest.mark.slow
def test_csv_and_markdown_agree_and_summaries_recompute_from_run_folders(
    tmp_path, finished, png_plots_only
):
    out, summary = copy_of(finished, tmp_path / "cmp")  # summary.json is removed below
    assert summary["reference"] == "MultiSimilarity"
    assert list(summary["differences"]) == ["Contrastive"]
    md = (out / "comparison.md").read_text()
    md_rows = _markdown_rows(md)
    header = [h.strip() for h in md.splitlines()[0].strip("|").split("|")]
    csv_rows = {r["method"]: r for r in csv.DictReader(open(out / "comparison.csv"))}
    assert set(md_rows) == set(csv_rows) == {"Contrastive", "MultiSimilarity"}
    checked = 0
    for method, cells in md_rows.items():
        for metric in summary["metrics"]:
            cell = cells[header.index(reporting.metric_label(metric))]
            mean, half = (float(x) for x in re.fullmatch(r"(-?[\d.]+) ± ([\d.]+)", cell).groups())
            row = csv_rows[method]
            assert mean == pytest.approx(float(row[f"{metric}_mean_pct"]), abs=0.005)
            assert half == pytest.approx(float(row[f"{metric}_ci95_half_width_pct"]), abs=0.005)
            st = summary["rows"][method][metric]
            assert 100 * st["mean"] == pytest.approx(float(row[f"{metric}_mean_pct"]), abs=1e-5)
            checked += 1
    assert checked == 2 * len(summary["metrics"]) > 0
    d = summary["differences"]["Contrastive"]["mean_average_precision_at_r"]
    row = csv_rows["Contrastive"]
    assert float(row["mean_average_precision_at_r_diff_vs_reference_pct"]) == pytest.approx(
        100 * d["mean"], abs=1e-5
    )
    assert row["reference"] == "MultiSimilarity"
    # The run folders alone give the same summary (what `compare --resume` relies on).
    (out / "summary.json").unlink()
    again = reporting.summarize_dir(out, reference="MultiSimilarity")
    assert (
        again["rows"]["Contrastive"]["r_precision"] == summary["rows"]["Contrastive"]["r_precision"]
    )
    assert again["differences"] == summary["differences"]
    assert (out / "comparison.md").read_text() == md.replace("(seeds, up to 2)", "(seeds, up to 2)")


def test_run_comparison_accepts_config_dicts(tmp_path, png_plots_only):
    cfg = two_methods()
    single = copy.deepcopy(cfg)
    single.pop("methods")
    single["name"] = "solo"
    summary = compare.run_comparison(
        [cfg, single], tmp_path / "cmp", overrides=FAST[1::2], pictures=False
    )
    assert list(summary["rows"]) == ["Contrastive", "MultiSimilarity", "solo"]
    assert summary["rows"]["solo"]["precision_at_1"]["n"] == 1
    assert "(n=1, no CI)" in (tmp_path / "cmp" / "comparison.md").read_text()
    assert "± 0.00" not in (tmp_path / "cmp" / "comparison.md").read_text()


@pytest.mark.slow  # two spawned workers each import torch and PML
def test_jobs_2_equals_jobs_1(tmp_path, config_file, finished, png_plots_only):
    torch.set_num_threads(1)
    seq_dir, seq = finished  # the same config, seeds and overrides, with --jobs 1
    assert seq["jobs"] == 1
    par = compare.run_comparison(
        config_file, tmp_path / "par", jobs=2, seeds=2, overrides=FAST[1::2], pictures=False
    )
    assert par["jobs"] == 2
    for method in ("Contrastive", "MultiSimilarity"):
        for metric in seq["metrics"]:
            assert par["rows"][method][metric]["values"] == seq["rows"][method][metric]["values"]
        for i in range(2):
            a = json.loads((seq_dir / method / f"seed{i}" / "metrics.json").read_text())
            b = json.loads((tmp_path / "par" / method / f"seed{i}" / "metrics.json").read_text())
            assert a["history"] == b["history"] and a["test"] == b["test"]


def test_compare_into_a_used_folder_is_refused_unless_resume_or_overwrite(
    config_file, tmp_path, monkeypatch, png_plots_only
):
    # Issue 12.1: compare used to rmtree an earlier run's folder silently when not resuming.
    out = tmp_path / "out"
    earlier = out / "Contrastive" / "seed0"
    earlier.mkdir(parents=True)
    (earlier / "metrics.json").write_text(json.dumps({"test": {}}))
    calls = []

    def fake_train(config, run_dir, resume=False, device=None, overwrite=False, **kw):
        calls.append((run_dir.name, resume, overwrite))
        raise RuntimeError("stop here: only the arguments matter")

    monkeypatch.setattr(runner, "train", fake_train)
    with pytest.raises(RunFolderError, match="--overwrite") as info:
        compare.run_comparison(config_file, out, methods=["Contrastive"], pictures=False)
    assert str(earlier) in str(info.value)
    assert calls == [] and (earlier / "metrics.json").exists()  # nothing trained, nothing removed
    summary = compare.run_comparison(
        config_file, out, methods=["Contrastive"], pictures=False, overwrite=True
    )
    assert calls == [("seed0", False, True)]  # the runner replaces only the run's own outputs
    assert summary["failed"]


def test_a_resume_adds_its_seconds_to_the_commands_that_trained_the_runs(
    tmp_path, finished, png_plots_only
):
    # The study's claims: `run_study.sh claims` resumed every finished claim, and each resume
    # (training nothing, 4 s) replaced the 562 s of the command that trained the claim.
    out, summary = copy_of(finished, tmp_path / "cmp")
    trained = summary["total_wall_seconds"]
    assert summary["pictures_seconds"] == 0.0  # --no-pictures: none drawn
    assert summary["commands"] == [
        {"total_wall_seconds": trained, "pictures_seconds": 0.0, "jobs": 1}
    ]
    again = dict(seeds=2, overrides=FAST[1::2], reference="MultiSimilarity", pictures=False)
    config = finished[0].parent / "two.yaml"
    resumed = compare.run_comparison(config, out, resume=True, **again)
    first, second = resumed["commands"]
    assert first == summary["commands"][0] and 0 < second["total_wall_seconds"] < trained
    assert resumed["total_wall_seconds"] == trained + second["total_wall_seconds"]
    assert json.loads((out / "summary.json").read_text())["commands"] == [first, second]
    # A summary written before the list existed counts as one command.
    legacy = json.loads((out / "summary.json").read_text())
    legacy.pop("commands")
    legacy |= {"total_wall_seconds": 561.9, "pictures_seconds": 2.5, "jobs": 2}
    (out / "summary.json").write_text(json.dumps(legacy))
    resumed = compare.run_comparison(config, out, resume=True, **again)
    assert resumed["commands"][0] == {
        "total_wall_seconds": 561.9,
        "pictures_seconds": 2.5,
        "jobs": 2,
    }
    assert resumed["total_wall_seconds"] == 561.9 + resumed["commands"][1]["total_wall_seconds"]
    assert resumed["pictures_seconds"] == 2.5  # this command drew none
    # ... one without the picture time leaves the sum unknown, not a partial sum
    legacy = {k: v for k, v in legacy.items() if k != "pictures_seconds"}
    (out / "summary.json").write_text(json.dumps(legacy))
    resumed = compare.run_comparison(config, out, resume=True, **again)
    assert "pictures_seconds" not in resumed and "pictures_seconds" not in resumed["commands"][0]
    # Not resuming: the folder's runs are replaced, and so is the record.
    fresh = compare.run_comparison(config, out, overwrite=True, **again)
    assert [c["total_wall_seconds"] for c in fresh["commands"]] == [fresh["total_wall_seconds"]]
