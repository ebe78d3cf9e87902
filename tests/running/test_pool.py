"""The console of many runs (issue 21 item 4): run-labelled log lines from ``--jobs`` workers,
no worker progress bars, repeated lines folded into one with a count."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import pool
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def console():
    """The root logger printing ``LEVEL name: message`` lines into a string, as the CLI does."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_repeated_warning_is_printed_once_with_a_count(console):
    pml, epochs = logging.getLogger("PML"), logging.getLogger(pool.EPOCH_LOGGER)
    with pool.repeated_logs_once():
        for run in ("A seed0", "A seed1", "B seed0"):
            with pool.run_label(run):
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
        assert f"INFO {pool.EPOCH_LOGGER}: [{run}] epoch 1/2  loss 0.5000" in lines
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
    args += ["--out", str(tmp_path / "out")]
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
    # iterations ("it/s]" or "s/it]"). The retrieval pictures drawn afterwards (parent) are not
    # part of the runs.
    runs_part = out[: out.rindex("compare: 100%")]
    assert "compare:" in runs_part
    assert "it/s]" not in runs_part and "s/it]" not in runs_part
    # PML's warning, once per run in the workers, is printed once with the count
    assert out.count('optimizers is missing "embedder_optimizer"') == 2
    assert 'optimizers is missing "embedder_optimizer" (repeated 4 times, shown once)' in out
