"""The console of many runs (issue 21 item 4): run-labelled log lines from ``--jobs`` workers,
no worker progress bars, repeated lines folded into one with a count. Run folders inside
``--out`` and refused runs that touch nothing (issue 28 items 1, 5)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import console as console_module
from pml_rank_plugins.running import pool, run_folder
from tests.log_capture import root_log_lines
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def console():
    """The root logger printing ``LEVEL name: message`` lines into a string, as the CLI does."""
    with root_log_lines() as stream:
        yield stream


def test_repeated_warning_is_printed_once_with_a_count(console):
    pml, epochs = logging.getLogger("PML"), logging.getLogger(console_module.EPOCH_LOGGER)
    with console_module.repeated_logs_once():
        for run in ("A seed0", "A seed1", "B seed0"):
            with console_module.run_label(run):
                pml.warning('%s is missing "%s"', "optimizers", "embedder_optimizer")
                epochs.info("epoch 1/2  loss 0.5000")  # identical by chance: still one per run
        pml.warning("only once")
    lines = console.getvalue().splitlines()
    assert lines.count('WARNING PML: [A seed0] optimizers is missing "embedder_optimizer"') == 1
    assert sum("embedder_optimizer" in ln for ln in lines) == 2
    assert lines[-1] == (
        'WARNING PML: optimizers is missing "embedder_optimizer" (repeated 3 times, shown once)'
    )
    for run in ("A seed0", "A seed1", "B seed0"):
        assert f"INFO {console_module.EPOCH_LOGGER}: [{run}] epoch 1/2  loss 0.5000" in lines
    assert "WARNING PML: only once" in lines and not any("only once (" in ln for ln in lines)
    # after the block nothing is folded or labelled any more
    pml.warning("only once")
    assert console.getvalue().splitlines()[-1] == "WARNING PML: only once"


@pytest.mark.slow
def test_jobs_2_prints_every_runs_epoch_lines_and_no_worker_bars(tmp_path):
    cfg = tiny_config(
        models={"embedder": {"TinyNet": {"in_features": 16, "embedding_dim": 8}}},
        trainer={"MetricLossOnly": {"iterations_per_epoch": 2}},
    )
    cfg["methods"] = {"A": None, "B": {"loss_funcs": {"metric_loss": {"TripletMarginLoss": {}}}}}
    dump_yaml(cfg, tmp_path / "tiny.yaml")
    args = ["compare", str(tmp_path / "tiny.yaml"), "--jobs", "2", "--seeds", "2"]
    args += ["--out", str(tmp_path / "out"), "--no-pictures"]  # drawn after the runs: not checked
    code = f"import sys, tests.tiny; from pml_rank_plugins.cli import main; sys.exit(main({args}))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("TQDM_DISABLE", None)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for run in ("A seed0", "A seed1", "B seed0", "B seed1"):
        for epoch in (1, 2):
            assert re.search(rf"\[{run}\] epoch {epoch}/2  loss \d", out), (run, epoch, out)
    # every bar before the comparison's last update is the parent's ("run"); PML's bars count
    # iterations ("it/s]" or "s/it]"). The retrieval pictures, drawn afterwards by the parent, are
    # not part of the runs (and not drawn here: --no-pictures).
    runs_part = out[: out.rindex("compare: 100%")]
    assert "compare:" in runs_part
    assert "it/s]" not in runs_part and "s/it]" not in runs_part
    # PML's warning, once per run in the workers, is printed once with the count
    assert out.count('optimizers is missing "embedder_optimizer"') == 2
    assert 'optimizers is missing "embedder_optimizer" (repeated 4 times, shown once)' in out


# --------------------------------------------------------------------------- issue 28 items 1, 5


def one_epoch(**kw):
    return tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}}, **kw)


def snapshot(folder: Path) -> dict:
    """Every file below ``folder`` with its bytes and modification time (ns)."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_run_job_outside_out_is_refused_and_creates_nothing(tmp_path):
    out = tmp_path / "out"
    (job,) = pool.make_jobs({"A": one_epoch()}, out, seeds=1)
    out.mkdir()
    (out / "A").symlink_to(tmp_path)  # swapped in after make_jobs
    rec = pool.run_job(job, resume=False)
    assert pool.is_refused(rec) and not pool.is_failed(rec)
    assert "outside --out" in rec["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_busy_folder_is_refused_and_nothing_written_or_removed(tmp_path, resume):
    (job,) = pool.make_jobs({"A": one_epoch()}, tmp_path / "out", seeds=1)
    job.run_dir.mkdir(parents=True)
    (job.run_dir / pool.FAILED_FILE).write_text('{"failed": true, "error": "theirs"}')
    with run_folder.lock(job.run_dir):  # another live run (flock: another open file)
        before = snapshot(job.run_dir)
        rec = pool.run_job(job, resume=resume)
        assert snapshot(job.run_dir) == before
    assert pool.is_refused(rec) and not pool.is_failed(rec)
    assert rec["error"].startswith(f"RunFolderBusy: {job.run_dir} is in use by another run")
    assert set(rec) == {"refused", "name", "run_id", "error"}


def test_failure_record_names_its_writer_and_resume_clears_only_under_the_lock(tmp_path):
    bad = one_epoch(optimizers={"trunk_optimizer": {"Adam": {"lr": -1.0}}})  # Adam refuses
    (job,) = pool.make_jobs({"A": bad}, tmp_path / "out", seeds=1)
    rec = pool.run_job(job, resume=False)
    assert pool.is_failed(rec) and "Invalid learning rate" in rec["error"]
    on_disk = json.loads((job.run_dir / pool.FAILED_FILE).read_text())
    assert on_disk["writer"] == {"pid": os.getpid(), "host": socket.gethostname()}
    # --resume retries the failed run: the record goes once this command holds the folder
    job.config = one_epoch(name="A")
    m = pool.run_job(job, resume=True)
    assert m["status"] == "finished" and not (job.run_dir / pool.FAILED_FILE).exists()


def test_resume_removes_a_stale_failure_record_beside_a_finished_run(tmp_path):
    (job,) = pool.make_jobs({"A": one_epoch()}, tmp_path / "out", seeds=1)
    m = pool.run_job(job, resume=False)
    assert m["status"] == "finished"
    stale = job.run_dir / pool.FAILED_FILE  # e.g. written by a refused run of an older version
    stale.write_text(json.dumps({"failed": True, "error": "RunFolderBusy: ..."}))
    with run_folder.lock(job.run_dir):  # busy: --resume leaves it alone
        assert pool.is_refused(pool.run_job(job, resume=True)) and stale.exists()
    again = pool.run_job(job, resume=True)
    assert again["test"] == m["test"] and not stale.exists()


def test_folder_filled_by_another_command_meanwhile_is_refused_not_failed(tmp_path):
    (job,) = pool.make_jobs({"A": one_epoch()}, tmp_path / "out", seeds=1)
    assert pool.run_job(job, resume=False)["status"] == "finished"  # "the other command"
    before = snapshot(job.run_dir)
    rec = pool.run_job(job, resume=False)  # execute() had seen an empty folder
    assert pool.is_refused(rec) and "now holds a finished run" in rec["error"]
    lock_file = job.run_dir / run_folder.LOCK_NAME  # taking the lock writes our pid there
    assert {p: v for p, v in snapshot(job.run_dir).items() if p != lock_file} == {
        p: v for p, v in before.items() if p != lock_file
    }


def test_execute_returns_refused_records_and_runs_the_others(tmp_path):
    jobs = pool.make_jobs({"A": one_epoch(), "B": one_epoch()}, tmp_path / "out", seeds=1)
    with run_folder.lock(jobs[0].run_dir):
        results = pool.execute(jobs, resume=False)
    assert pool.is_refused(results["A"]["seed0"])
    assert results["B"]["seed0"]["status"] == "finished"
    assert sorted(p.name for p in jobs[0].run_dir.iterdir()) == [".lock"]
