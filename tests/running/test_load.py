"""Using a trained model (issue 29, item 3): ``load_run``, ``embed``, ``save_embeddings`` on a tiny
run trained here (1 epoch x 2 iterations), and their refusals."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import pml_rank_plugins
from pml_rank_plugins.experiment import build_experiment, build_tester
from pml_rank_plugins.experiment.schema import dump_yaml, load_yaml
from pml_rank_plugins.running import (
    CheckpointError,
    LoadedRun,
    RunFolderError,
    embed,
    load_run,
    save_embeddings,
    train,
)
from pml_rank_plugins.running.checkpoints import load_models
from pml_rank_plugins.running.load import _eval_transforms_everywhere
from tests.tiny import tiny_config

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("load_run_dir")


def tiny_run_config() -> dict:
    return tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1, "iterations_per_epoch": 2}})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("load") / "run"
    train(tiny_run_config(), out)
    return out


def test_load_run_models_in_eval_mode_with_the_best_checkpoint(run_dir):
    loaded = load_run(run_dir)
    assert isinstance(loaded, LoadedRun)
    assert loaded.checkpoint == run_dir / "checkpoints" / "best.pt"
    assert loaded.epoch == 1 and loaded.run_dir == run_dir
    assert loaded.config == load_yaml(run_dir / "config.yaml")
    assert loaded.device == torch.device("cpu")
    assert set(loaded.datasets) == {"train", "val", "test"}
    for model in (loaded.trunk, loaded.embedder):
        assert not any(m.training for m in model.modules())
    assert isinstance(loaded.embedder, torch.nn.Identity)  # the tiny config has no embedder
    saved = torch.load(loaded.checkpoint, weights_only=True)["models"]["trunk"]
    state = loaded.trunk.state_dict()
    assert set(state) == set(saved)
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
        assert state[key].device == torch.device("cpu")
    with pytest.raises(AttributeError):  # frozen
        loaded.epoch = 2


def test_load_run_latest_and_the_top_level_name(run_dir):
    loaded = pml_rank_plugins.load_run(run_dir, which="latest")
    assert pml_rank_plugins.load_run is load_run and pml_rank_plugins.embed is embed
    assert loaded.checkpoint == run_dir / "checkpoints" / "latest.pt"
    assert loaded.epoch == 1


def test_load_run_leaves_the_global_rng_as_it_was(run_dir):
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    load_run(run_dir)  # build_experiment seeds everything with the config's seed
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def test_embed_equals_the_runs_tester_and_a_hand_computation(run_dir):
    loaded = load_run(run_dir)
    emb, labels = embed(loaded, "test", batch_size=5)  # 18 items: batches of 5, 5, 5, 3
    assert emb.dtype == np.float32 and emb.shape == (18, 16)
    # the run's own tester on an experiment rebuilt the way `pml-rank eval` rebuilds it
    config = load_yaml(run_dir / "config.yaml")
    exp = build_experiment(config, "cpu")
    load_models(exp.models, run_dir / "checkpoints" / "best.pt")
    tester = build_tester(config, torch.device("cpu"))
    want, want_labels = tester.get_all_embeddings(
        exp.datasets["test"], exp.models["trunk"], exp.models["embedder"]
    )
    np.testing.assert_allclose(emb, want.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, want_labels.numpy())
    # by hand: every item through the trunk in eval mode, then L2-normalized (the tester default)
    dataset = loaded.datasets["test"]
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    with torch.no_grad():
        raw = loaded.trunk(images).double()
    by_hand = (raw / raw.norm(dim=1, keepdim=True)).numpy()
    np.testing.assert_allclose(emb, by_hand, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, np.asarray(dataset.labels))
    assert labels.shape == (18, 2)
    # a dataset object works as well as a split name; the batch size changes only the rounding
    emb2, _ = embed(loaded, dataset)
    np.testing.assert_allclose(emb2, emb, rtol=0, atol=1e-6)


def test_embed_refuses_an_unknown_split_and_a_bad_batch_size(run_dir):
    loaded = load_run(run_dir)
    with pytest.raises(ValueError, match=r"split 'query': not a split .* train, val, test"):
        embed(loaded, "query")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch_size"):
            embed(loaded, "test", batch_size=bad)


def test_load_run_refuses_a_folder_that_is_not_a_finished_run(run_dir, tmp_path):
    with pytest.raises(RunFolderError, match="config.yaml not found.*not a run folder"):
        load_run(tmp_path)
    dump_yaml(tiny_run_config(), tmp_path / "config.yaml")  # a run that never finished an epoch
    with pytest.raises(CheckpointError, match=r"latest\.pt: no such checkpoint.*not a finished"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="which='worst'"):
        load_run(run_dir, which="worst")


def test_load_run_refuses_the_top_folder_of_an_mlrc_run(tmp_path):
    config = tiny_run_config()
    config["split"] = {"mlrc_protocol": {"num_folds": 2}}
    dump_yaml(config, tmp_path / "config.yaml")
    with pytest.raises(RunFolderError, match="MLRC protocol folder.*fold0"):
        load_run(tmp_path)


def test_eval_transforms_feed_every_split_and_the_config_is_not_changed():
    config = {"transforms": {"train": [{"RandomCrop": {"size": 8}}], "eval": [{"Resize": 8}]}}
    copy = _eval_transforms_everywhere(config)
    assert copy["transforms"]["train"] == [{"Resize": 8}]
    assert config["transforms"]["train"] == [{"RandomCrop": {"size": 8}}]
    assert _eval_transforms_everywhere({"seed": 0}) == {"seed": 0}


def test_save_embeddings_npz_and_npy(tmp_path):
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    labels = np.array([[0, 0], [0, 0], [1, 0], [2, 1]])
    files = save_embeddings(tmp_path / "e.npz", emb, labels, split="test", checkpoint="best.pt")
    assert files == [tmp_path / "e.npz"]
    with np.load(tmp_path / "e.npz", allow_pickle=False) as data:
        assert sorted(data.files) == ["checkpoint", "embeddings", "labels", "split"]
        np.testing.assert_array_equal(data["embeddings"], emb)
        np.testing.assert_array_equal(data["labels"], labels)
        assert str(data["split"]) == "test" and str(data["checkpoint"]) == "best.pt"
    files = save_embeddings(tmp_path / "e.npy", emb, labels, split="ignored")
    assert files == [tmp_path / "e.npy", tmp_path / "e_labels.npy"]
    np.testing.assert_array_equal(np.load(files[0]), emb)
    np.testing.assert_array_equal(np.load(files[1]), labels)
    umask = os.umask(0)
    os.umask(umask)
    assert (files[0].stat().st_mode & 0o777) == 0o666 & ~umask  # not a temp file's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "e.npz", "e_labels.npy"]


def test_save_embeddings_refuses_bad_outputs_and_leaves_nothing(tmp_path, monkeypatch):
    emb, labels = np.zeros((2, 3), np.float32), np.zeros((2, 2), np.int64)
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.npz").mkdir()
    bad = {
        "e.csv": "must end in .npz or .npy",
        "missing/e.npz": "missing: not an existing folder",
        "file/e.npz": "file: not an existing folder",
        "folder.npz": "folder.npz: is a folder",
    }
    for name, message in bad.items():
        with pytest.raises(ValueError, match=message):
            save_embeddings(tmp_path / name, emb, labels)

    def fail(*args, **kwargs):  # the second file of the pair fails half-way
        raise OSError(5, "Input/output error")

    saves = iter([np.save, fail])
    monkeypatch.setattr(np, "save", lambda f, a: next(saves)(f, a))
    with pytest.raises(OSError, match=r"e\.npy: cannot write: Input/output error"):
        save_embeddings(tmp_path / "e.npy", emb, labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.npz"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_load_run_on_cuda_matches_the_cpu(run_dir):
    loaded = load_run(run_dir, device="cuda")
    assert loaded.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in loaded.trunk.parameters())
    emb, labels = embed(loaded, "test")
    cpu_emb, cpu_labels = embed(load_run(run_dir, device="cpu"), "test")
    np.testing.assert_allclose(emb, cpu_emb, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(labels, cpu_labels)
