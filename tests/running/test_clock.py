"""Where a run's wall time goes: ``metrics.json`` ``phase_seconds`` (issue 27 item 4)."""

from __future__ import annotations

import json
import time

import numpy as np

from pml_rank_plugins.running import train
from pml_rank_plugins.running.clock import PhaseClock
from tests.tiny import tiny_config


def test_phase_clock_sums_the_blocks_of_each_name():
    clock = PhaseClock()
    for _ in range(2):
        with clock.phase("a"):
            time.sleep(0.02)
    with clock.phase("b"):
        pass
    assert 0.04 <= clock.seconds["a"] < 1.0 and clock.seconds["b"] < 0.04
    assert set(clock.as_dict()) == {"a", "b"}


def test_a_run_records_its_phases_within_its_wall_time(tmp_path):
    metrics = train(tiny_config(), tmp_path / "r")
    phases = json.loads((tmp_path / "r" / "metrics.json").read_text())["phase_seconds"]
    assert {"setup", "train", "validation", "checkpoints", "test"} <= set(phases)
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) <= metrics["train_seconds_this_call"] + 1e-3


def test_a_run_saves_its_test_embeddings_for_the_pictures(tmp_path):
    train(tiny_config(), tmp_path / "r")
    (saved,) = (tmp_path / "r" / "embeddings").glob("*.npz")
    with np.load(saved, allow_pickle=False) as data:
        assert str(data["checkpoint"]) in ("best.pt", "latest.pt")
        emb = data["embeddings"]
        assert emb.dtype == np.float32 and emb.ndim == 2 and len(data["labels"]) == len(emb)
