"""End-to-end runs on a tiny registered dataset/model: outputs, resume equivalence, eval, no faiss."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys

import pytest
import torch

from pml_rank_plugins.experiment.schema import load_yaml
from pml_rank_plugins.experiment.spec import plain
from pml_rank_plugins.running import runner
from pml_rank_plugins.running.checkpoints import atomic_torch_save, load_checkpoint
from tests.tiny import tiny_config

METRICS = {
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "recall_at_1",
    "recall_at_2",
    "recall_at_4",
}


def test_tiny_run_writes_everything(tmp_path):
    run = tmp_path / "run"
    m = runner.train(tiny_config(), run)
    assert set(m["test"]) == {"test"} and set(m["test"]["test"]) == METRICS
    assert [h["epoch"] for h in m["history"]] == [1, 2]
    assert all(set(h["validation"]["val"]) == METRICS for h in m["history"])
    assert m["best"]["epoch"] in (1, 2)
    for f in ("config.yaml", "metrics.json", "checkpoints/latest.pt", "checkpoints/best.pt"):
        assert (run / f).is_file(), f
    assert (run / "logs" / "logs.db").is_file()
    assert (run / "logs" / "loss_histories.csv").is_file()
    assert any("VAL" in p.name for p in (run / "logs").glob("accuracies*.csv"))
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert not list((run / "checkpoints").glob("*.tmp"))  # atomic writes leave nothing behind
    ckpt = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert ckpt["epoch"] == 2 and {"torch", "numpy", "python"} <= set(ckpt["rng"])
    assert json.loads((run / "metrics.json").read_text())["test"] == m["test"]

    # `eval` rebuilds the run and reproduces the test metrics of the best checkpoint.
    ev = runner.evaluate(run)
    assert ev["epoch"] == m["best"]["epoch"]
    assert ev["test"] == pytest.approx(m["test"]["test"])


@pytest.mark.parametrize(
    "sampler",
    [{"MPerClassSampler": {"m": 3, "length_before_new_iter": 36}}, None],
    ids=["m_per_class_numpy_rng", "shuffle_torch_rng"],
)
def test_resume_equals_uninterrupted(tmp_path, sampler):
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 3}})
    cfg["sampler"] = sampler
    cfg["lr_schedulers"] = {"trunk_scheduler_by_epoch": {"StepLR": {"step_size": 1, "gamma": 0.5}}}
    straight = runner.train(cfg, tmp_path / "a")
    part = runner.train(cfg, tmp_path / "b", stop_after_epoch=1)
    assert part["interrupted_after_epoch"] == 1
    torch.manual_seed(12345)  # a fresh process would have other RNG states: resume must not care
    resumed = runner.train(None, tmp_path / "b", resume=True)
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "latest.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")
    for key in ("models", "optimizers", "lr_schedulers"):
        assert a[key].keys() == b[key].keys()
    for name, state in a["models"].items():
        for k, v in state.items():
            assert torch.equal(v, b["models"][name][k]), (name, k)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert straight["history"] == resumed["history"]
    assert straight["test"] == resumed["test"]
    assert straight["best"] == resumed["best"]
    # The logs of the resumed run continue the interrupted ones: same epochs, nothing twice.
    for run in ("a", "b"):
        db = sqlite3.connect(tmp_path / run / "logs" / "logs.db")
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        val = next(t for t in tables if t.endswith("VAL_vs_self"))
        epochs = [r[0] for r in db.execute(f"SELECT epoch FROM {val}")]
        assert epochs == [1, 2, 3], (run, epochs)
    # Training again without --resume (with --overwrite) starts clean instead of appending.
    again = runner.train(cfg, tmp_path / "a", overwrite=True)
    assert again["history"] == straight["history"]
    db = sqlite3.connect(tmp_path / "a" / "logs" / "logs.db")
    assert [r[0] for r in db.execute(f"SELECT epoch FROM {val}")] == [1, 2, 3]


def test_resume_refuses_a_changed_config(tmp_path):
    cfg = tiny_config()
    runner.train(cfg, tmp_path / "r", stop_after_epoch=1)
    cfg["seed"] = 99
    with pytest.raises(ValueError, match="config differs"):
        runner.train(cfg, tmp_path / "r", resume=True)


def test_runs_without_faiss(tmp_path, monkeypatch):
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}})
    reference = runner.train(cfg, tmp_path / "faiss")
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now raises ImportError
    with_faiss_hidden = runner.train(cfg, tmp_path / "nofaiss")
    assert with_faiss_hidden["test"]["test"] == pytest.approx(reference["test"]["test"])


def test_query_gallery_and_patience(tmp_path):
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 4}})
    cfg["split"]["query_gallery"] = {"test": ["query", "gallery"], "fraction": 0.5}
    cfg["eval"]["test"] = [{"query": "query", "reference": ["gallery"]}]
    cfg["eval"]["patience"] = 0
    cfg["optimizers"]["trunk_optimizer"] = {"SGD": {"lr": 0.0}}  # nothing improves after epoch 1
    m = runner.train(cfg, tmp_path / "qg")
    assert m["stopped_early"] and m["epochs_run"] == 2 and m["best"]["epoch"] == 1
    again = runner.train(None, tmp_path / "qg", resume=True)  # a finished run stays finished
    assert again["epochs_run"] == 2 and again["history"] == m["history"]
    assert set(m["test"]) == {"query"} and set(m["test"]["query"]) == METRICS


def test_atomic_save_keeps_the_previous_checkpoint_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "ck" / "latest.pt"
    atomic_torch_save({"epoch": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path) == {"epoch": 1}
    assert [p.name for p in path.parent.iterdir()] == ["latest.pt"]


def test_whole_dataset_without_split_trains(tmp_path):
    cfg = tiny_config()
    cfg["split"] = {"names": ["train"]}
    cfg["eval"] = {"validation": ["train"], "recall_at_k": [1]}
    m = runner.train(cfg, tmp_path / "nosplit")
    assert set(m["test"]["train"]) == {
        "precision_at_1",
        "r_precision",
        "mean_average_precision_at_r",
        "recall_at_1",
    }


def test_nested_objects_user_accuracy_calculator(tmp_path):
    """A tester spec may carry its own calculator, built from nested object specs."""
    calc = {
        "RecallAtKAccuracyCalculator": {
            "recall_at_k": [1, 3],
            "include": ["precision_at_1", "recall_at_1", "recall_at_3"],
            "knn_func": {"CustomKNN": {"distance": {"CosineSimilarity": {}}}},
        }
    }
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}})
    cfg["eval"]["tester"] = {"GlobalEmbeddingSpaceTester": {"accuracy_calculator": calc}}
    cfg["eval"]["primary_metric"] = "precision_at_1"
    m = runner.train(cfg, tmp_path / "calc")
    assert set(m["test"]["test"]) == {"precision_at_1", "recall_at_1", "recall_at_3"}
    assert m["test"]["test"]["recall_at_1"] == m["test"]["test"]["precision_at_1"]


def test_primary_metric_must_be_computed(tmp_path):
    from pml_rank_plugins.experiment.schema import ConfigError

    cfg = tiny_config()
    cfg["eval"]["primary_metric"] = "recall_at_32"
    with pytest.raises(ConfigError, match="recall_at_32"):
        runner.train(cfg, tmp_path / "bad")


def test_crash_mid_epoch_then_resume_equals_uninterrupted(tmp_path, monkeypatch):
    """A real interruption (inside epoch 2) loses only that epoch's partial work."""
    from pytorch_metric_learning.trainers import MetricLossOnly

    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 3}})
    straight = runner.train(cfg, tmp_path / "a")

    original = MetricLossOnly.calculate_loss
    calls = {"n": 0}

    def crashing(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:  # epoch 2, iteration 2 (3 iterations per epoch)
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(MetricLossOnly, "calculate_loss", crashing)
    with pytest.raises(KeyboardInterrupt):
        runner.train(cfg, tmp_path / "b")
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")["epoch"] == 1
    resumed = runner.train(cfg, tmp_path / "b", resume=True)
    assert resumed["history"] == straight["history"]
    assert resumed["test"] == straight["test"]
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "latest.pt")["models"]
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "latest.pt")["models"]
    assert all(torch.equal(a["trunk"][k], b["trunk"][k]) for k in a["trunk"])


def test_resume_extends_a_finished_run_like_a_longer_one(tmp_path):
    """--resume --set trainer.num_epochs=3 on a finished 2-epoch run = a straight 3-epoch run."""
    three = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 3}})
    straight = runner.train(three, tmp_path / "a")
    runner.train(tiny_config(), tmp_path / "b")  # 2 epochs, finished
    longer = runner.train(three, tmp_path / "b", resume=True)
    assert longer["epochs_run"] == 3 and longer["history"] == straight["history"]
    assert longer["test"] == straight["test"]
    assert load_yaml(tmp_path / "b" / "config.yaml") == plain(three)


def test_resume_with_a_longer_patience_continues_an_early_stopped_run(tmp_path):
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": 4}})
    cfg["optimizers"]["trunk_optimizer"] = {"SGD": {"lr": 0.0}}  # nothing improves after epoch 1
    cfg["eval"]["patience"] = 0
    m = runner.train(cfg, tmp_path / "r")
    assert m["stopped_early"] and m["epochs_run"] == 2
    cfg["eval"]["patience"] = None
    cfg["eval"]["test_interval"] = 2
    again = runner.train(cfg, tmp_path / "r", resume=True)
    assert again["epochs_run"] == 4 and not again["stopped_early"]
    assert [("validation" in h) for h in again["history"]] == [True, True, False, True]


def test_resume_refusal_lists_the_changed_keys(tmp_path):
    from pml_rank_plugins.experiment.schema import ConfigError

    cfg = tiny_config()
    runner.train(cfg, tmp_path / "r", stop_after_epoch=1)
    cfg["seed"] = 99
    cfg["optimizers"]["trunk_optimizer"]["Adam"]["lr"] = 0.5
    cfg["trainer"]["MetricLossOnly"]["num_epochs"] = 5  # allowed, so not listed
    with pytest.raises(ConfigError) as info:
        runner.train(cfg, tmp_path / "r", resume=True)
    msg = str(info.value)
    assert "seed: 0 -> 99" in msg and "optimizers.trunk_optimizer.Adam.lr: 0.01 -> 0.5" in msg
    assert "num_epochs: 2" not in msg and "trainer.*.num_epochs" in msg


def test_one_console_line_per_epoch(tmp_path, caplog):
    import re

    with caplog.at_level(logging.INFO, logger="pml_rank_plugins.running.training"):
        m = runner.train(tiny_config(), tmp_path / "r")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    pattern = r"epoch (\d)/2  loss (\d+\.\d{4})  val mean_average_precision_at_r (\d\.\d{4}) \(best \d\.\d{4} @ \d\)  \d+\.\d s"
    assert len(lines) == 2, lines
    for line, h in zip(lines, m["history"]):
        epoch, loss, value = re.fullmatch(pattern, line).groups()
        assert int(epoch) == h["epoch"] and float(loss) == pytest.approx(h["train_loss"], abs=1e-4)
        assert float(value) == pytest.approx(
            h["validation"]["val"]["mean_average_precision_at_r"], abs=1e-4
        )


def test_on_epoch_sees_every_row_and_can_stop_the_run_like_an_interruption(tmp_path):
    seen = []

    def stop_after_first(row):
        seen.append(row["epoch"])
        return row["epoch"] == 1

    m = runner.train(tiny_config(), tmp_path / "r", on_epoch=stop_after_first)
    assert m["interrupted_after_epoch"] == 1 and seen == [1]
    assert "validation" in m["history"][0]  # the row is the one recorded in the history
    assert not (tmp_path / "r" / "metrics.json").exists()
    resumed = runner.train(None, tmp_path / "r", resume=True, on_epoch=stop_after_first)
    whole = runner.train(tiny_config(), tmp_path / "whole")
    assert seen == [1, 2] and resumed["history"] == whole["history"]  # resumes like any run


def test_resume_accepts_a_new_data_root(tmp_path):
    # `make test` / a user's shell may set PML_RANK_DATA after the run was trained without it:
    # where the data lives is not part of the experiment, so resume takes it (like eval does)
    runner.train(tiny_config(), tmp_path / "r", stop_after_epoch=1)
    moved = dict(tiny_config(), data_root=str(tmp_path))
    m = runner.train(moved, tmp_path / "r", resume=True)
    assert m["epochs_run"] == 2
    with pytest.raises(Exception, match="seed: 0 -> 5"):  # everything else is still refused
        runner.train(dict(moved, seed=5), tmp_path / "r", resume=True)
