"""The run state a checkpoint carries and the one result a run writes (issue 30 item 2).

The ``metrics.json`` keys (and their order) are the run-folder format: they are written out here
as literals, so a change to them fails this test.
"""

from __future__ import annotations

import json

import pytest

from pml_rank_plugins.running import runner
from pml_rank_plugins.running.checkpoints import load_checkpoint
from pml_rank_plugins.running.run_state import RunResult, RunState
from tests.tiny import tiny_config

FINISHED_KEYS = [
    "name",
    "status",
    "seed",
    "epochs_run",
    "stopped_early",
    "best",
    "history",
    "test",
    "train_seconds_this_call",
    "phase_seconds",
    "run_info",
]
FAILED_KEYS = [
    "name",
    "status",
    "error",
    "failed_in_epoch",
    "seed",
    "epochs_run",
    "best",
    "history",
    "test",
]


def two_rows() -> RunState:
    history = [
        {"epoch": 1, "train_loss": 0.5, "validation": {"val": {"m": 0.25}}},
        {"epoch": 2, "train_loss": 0.4, "validation": {"val": {"m": 0.5}}},
    ]
    return RunState(epoch=2, history=history, best={"epoch": 2, "value": 0.5})


def test_state_improves_and_best_validation():
    state = RunState()
    assert state.epochs_run == 0 and state.best_validation() == {}
    assert not state.improves(None) and state.improves(0.0)
    state = two_rows()
    assert state.improves(0.6) and not state.improves(0.5) and not state.improves(None)
    assert state.epochs_run == 2 and state.best_validation() == {"val": {"m": 0.5}}


@pytest.mark.parametrize("patience,stopped", [(None, False), (0, True), (3, False)])
def test_restore_rejudges_the_plateau_with_the_patience_given(patience, stopped):
    state = two_rows()
    state.best = {"epoch": 1, "value": 0.25}
    ckpt = {"epoch": 2, "history": state.history, "best": state.best}
    again = RunState.restore(ckpt, patience)
    assert (again.epoch, again.history, again.best) == (2, state.history, state.best)
    assert again.stopped_early is stopped


def test_result_keys_in_the_format_of_earlier_versions():
    state = two_rows()
    timing = {"train_seconds_this_call": 1.0, "phase_seconds": {"train": 0.5}}
    done = RunResult("A", 3, state, test={"test": {"m": 1.0}}, timing=timing, run_info={})
    assert list(done.as_dict()) == FINISHED_KEYS
    assert done.as_dict()["epochs_run"] == 2 and done.as_dict()["seed"] == 3
    failed = RunResult.failed("A", 3, state, ValueError("bad"), 3).as_dict()
    assert list(failed) == FAILED_KEYS
    assert (failed["status"], failed["error"], failed["failed_in_epoch"]) == (
        "failed",
        "ValueError: bad",
        3,
    )
    interrupted = RunResult("A", 3, state, "interrupted").as_dict()
    assert interrupted == {
        "interrupted_after_epoch": 2,
        "history": state.history,
        "best": state.best,
    }


def test_a_run_writes_the_result_and_checkpoints_the_state(tmp_path):
    run = tmp_path / "run"
    metrics = runner.train(tiny_config(), run)
    assert list(metrics) == FINISHED_KEYS
    assert json.loads((run / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    ckpt = load_checkpoint(run / "checkpoints" / "latest.pt")
    restored = RunState.restore(ckpt, None)
    assert restored.epoch == 2 and ckpt["stopped_early"] is False
    assert restored.history == metrics["history"] and restored.best == metrics["best"]
