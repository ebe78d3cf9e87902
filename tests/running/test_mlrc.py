"""MLRC protocol (4 class-disjoint folds, concatenated / separated test), per-split datasets and
transforms, data roots and the errors of wrong configs."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pml_rank_plugins import reporting
from pml_rank_plugins.cli import main
from pml_rank_plugins.data import CUB200, GlyphDataset
from pml_rank_plugins.experiment import builder
from pml_rank_plugins.experiment.mlrc import mlrc_fold_config
from pml_rank_plugins.experiment.schema import ConfigError, dump_yaml, load_yaml, validate
from pml_rank_plugins.running import mlrc, runner
from pml_rank_plugins.running.run_folder import RunFolderBusy, RunFolderError
from tests.data.benchmark_fixtures import write_cub

GLYPHS = {
    "GlyphDataset": {
        "seed": 0,
        "images_per_class": 4,
        "image_size": 16,
        "max_classes_per_category": 3,
        "categories": ["latin_upper", "latin_lower", "digits"],
    }
}


def glyph_mlrc_config() -> dict:
    return {
        "seed": 0,
        "dataset": copy.deepcopy(GLYPHS),
        "split": {"mlrc_protocol": {"num_folds": 4}},
        "models": {
            "trunk": {"ConvEmbedder": {"in_channels": 1, "embedding_dim": 6, "widths": [4]}},
            "embedder": {"Identity": {}},
        },
        "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}},
        "sampler": {"RandomClassSampler": {"samples_per_class": 2}},
        "optimizers": {"trunk_optimizer": {"Adam": {"lr": 0.01}}},
        "trainer": {
            "MetricLossOnly": {"batch_size": 4, "iterations_per_epoch": 1, "num_epochs": 2}
        },
        "eval": {
            "tester": {"GlobalEmbeddingSpaceTester": {"dataloader_num_workers": 0}},
            "metrics": ["precision_at_1", "mean_average_precision_at_r"],
            "recall_at_k": [1],
            "validation": ["val"],
            "test": ["test"],
        },
    }


def test_mlrc_folds_are_class_disjoint_and_cover_the_first_half():
    cfg = glyph_mlrc_config()
    labels = np.asarray(GlyphDataset(**GLYPHS["GlyphDataset"]).labels)[:, 0]
    classes = np.unique(labels)
    first, second = set(classes[: len(classes) // 2]), set(classes[len(classes) // 2 :])
    val_classes = []
    for k in range(4):
        splits = builder.build_splits(mlrc_fold_config(cfg, k), 0)
        tr, va, te = (set(np.asarray(splits[s].labels)[:, 0]) for s in ("train", "val", "test"))
        assert not tr & va and (tr | va) == first and te == second
        val_classes.append(va)
    assert set().union(*val_classes) == first and sum(map(len, val_classes)) == len(first)


def _plain_precision_at_1(emb: torch.Tensor, labels: torch.Tensor) -> float:
    """Leave-one-out nearest neighbour by cosine similarity, one query at a time."""
    hits = 0
    for i in range(len(emb)):
        sims = [float(emb[i] @ emb[j]) if j != i else -np.inf for j in range(len(emb))]
        hits += int(labels[int(np.argmax(sims))] == labels[i])
    return hits / len(emb)


@pytest.mark.slow
def test_mlrc_trains_four_fold_models_and_reports_both(tmp_path):
    cfg = glyph_mlrc_config()
    metrics = runner.train(cfg, tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["test"].keys() == {"concatenated", "separated"} == metrics["test"].keys()
    assert saved["num_folds"] == 4 and len(saved["folds"]) == 4
    assert saved["embedding_dim"] == {"concatenated": 24, "separated": 6}
    folds = [json.loads((tmp_path / f"fold{k}" / "metrics.json").read_text()) for k in range(4)]
    for m in ("precision_at_1", "mean_average_precision_at_r"):
        expected = np.mean([f["test"]["test"][m] for f in folds])
        assert saved["test"]["separated"][m] == pytest.approx(expected)
    assert saved["best"]["epoch"] == [f["best"]["epoch"] for f in folds]
    assert saved["best"]["value"] == pytest.approx(np.mean([f["best"]["value"] for f in folds]))
    # the protocol's validation history: per epoch, the mean over the folds that ran it
    assert [r["epoch"] for r in saved["history"]] == sorted(
        {r["epoch"] for f in folds for r in f["history"]}
    )
    for row in saved["history"]:
        runs = [r for f in folds for r in f["history"] if r["epoch"] == row["epoch"]]
        expected = np.mean([r["validation"]["val"]["precision_at_1"] for r in runs])
        assert row["validation"]["val"]["precision_at_1"] == pytest.approx(expected)
    # concatenated: embed the test half with each fold's best weights, L2-normalize each model's
    # 6-d output, concatenate to 24-d, score leave-one-out P@1 with a plain loop
    test_set = builder.build_splits(mlrc_fold_config(cfg, 0), 0)["test"]
    images = torch.stack([test_set[i][0] for i in range(len(test_set))])
    labels = torch.as_tensor(np.asarray(test_set.labels)[:, 0])
    parts = []
    for k in range(4):
        models = builder.build_models(mlrc_fold_config(cfg, k), torch.device("cpu"))
        state = torch.load(tmp_path / f"fold{k}" / "checkpoints" / "best.pt", weights_only=True)
        models["trunk"].load_state_dict(state["models"]["trunk"])
        with torch.no_grad():
            parts.append(F.normalize(models["trunk"].eval()(images), dim=1))
    concat = torch.cat(parts, dim=1)
    assert concat.shape[1] == 4 * parts[0].shape[1]
    assert saved["test"]["concatenated"]["precision_at_1"] == pytest.approx(
        _plain_precision_at_1(concat, labels)
    )
    again = runner.evaluate(tmp_path)
    assert again["test"]["concatenated"] == pytest.approx(saved["test"]["concatenated"])
    assert len(again["folds"]) == 4


def test_one_fold_alone_is_an_ordinary_run(tmp_path):
    cfg = glyph_mlrc_config()
    cfg["split"]["fold"] = 2
    metrics = runner.train(cfg, tmp_path)
    assert set(metrics["test"]) == {"test"} and not (tmp_path / "fold0").exists()


@pytest.mark.parametrize(
    "split,match",
    [
        ({"mlrc_protocol": {}, "names": ["train", "val", "test"]}, "mlrc_protocol makes fixed"),
        ({"class_disjoint_kfold": {"num_folds": 4}}, r"split: \{mlrc_protocol"),
        ({"mlrc_protocol": {}, "fold": 4}, r"split.fold: 4 is not in 0..3"),
    ],
)
def test_wrong_split_configs_explain_the_fix(split, match):
    cfg = glyph_mlrc_config()
    cfg["split"] = split
    with pytest.raises(ConfigError, match=match):
        builder.build_splits(cfg, 0)


def test_mlrc_without_fold_tells_how_to_build_one():
    with pytest.raises(ConfigError, match=r"--set split.fold=K"):
        builder.build_splits(glyph_mlrc_config(), 0)


# --------------------------------------------------------------------------- splits, transforms

TRANSFORMS = {
    "train": [{"RandomResizedCrop": {"size": 8}}, {"ToTensor": {}}],
    "eval": [{"Resize": {"size": 10}}, {"CenterCrop": {"size": 10}}, {"ToTensor": {}}],
}


def cub_config(data_root, **extra) -> dict:
    cfg = glyph_mlrc_config()
    cfg.pop("dataset"), cfg.pop("split")
    cfg["data_root"] = str(data_root)
    cfg["models"]["trunk"] = {"ConvEmbedder": {"in_channels": 3, "embedding_dim": 4, "widths": [4]}}
    cfg.update(extra)
    return cfg


def test_published_splits_and_per_split_transforms(tmp_path):
    write_cub(tmp_path)
    cfg = cub_config(
        tmp_path,
        datasets={
            "train": {"CUB200": {"root": "CUB_200_2011", "split": "train"}},
            "test": {"CUB200": {"root": "CUB_200_2011", "split": "test"}},
        },
        transforms=copy.deepcopy(TRANSFORMS),
    )
    validate(cfg)
    splits = builder.build_splits(cfg, 0)
    assert len(splits["train"]) == len(CUB200(tmp_path / "CUB_200_2011", "train")) == 48
    assert splits["train"][0][0].shape == (3, 8, 8) and splits["test"][0][0].shape == (3, 10, 10)
    assert set(np.asarray(splits["test"].labels)[:, 0]) == set(range(100, 112))


def test_split_function_subsets_use_train_and_eval_transforms(tmp_path):
    write_cub(tmp_path)
    cfg = cub_config(
        tmp_path,
        dataset={"CUB200": {"root": "CUB_200_2011", "split": "all"}},
        split={"class_disjoint_split": {"fractions": [0.5, 0.5]}, "names": ["train", "test"]},
        transforms=copy.deepcopy(TRANSFORMS),
    )
    splits = builder.build_splits(cfg, 0)
    assert splits["train"][0][0].shape == (3, 8, 8) and splits["test"][0][0].shape == (3, 10, 10)


def test_unequal_image_sizes_name_the_transform_key(tmp_path):
    write_cub(tmp_path)
    cfg = cub_config(
        tmp_path,
        datasets={"train": {"CUB200": {"root": "CUB_200_2011", "split": "train"}}},
        transforms={"train": [{"ToTensor": {}}], "eval": TRANSFORMS["eval"]},
    )
    cfg["eval"].update(validation=[], test=[])
    with pytest.raises(ConfigError, match=r"train split: transforms.train: images of unequal"):
        runner.train(cfg, tmp_path / "run")
    del cfg["transforms"]
    with pytest.raises(ConfigError, match=r"transforms \(not set: the dataset's built-in"):
        runner.train(cfg, tmp_path / "run2")


def test_missing_data_root_names_key_folder_and_archive(tmp_path):
    cfg = cub_config(tmp_path, dataset={"CUB200": {"root": "CUB_200_2011", "split": "all"}})
    with pytest.raises(ConfigError) as err:
        builder.build_splits(cfg, 0)
    text = str(err.value)
    assert "dataset.CUB200.root" in text and str(tmp_path / "CUB_200_2011") in text
    assert "CUB_200_2011.tgz" in text and f"data root {tmp_path}" in text


def test_transforms_need_an_eval_list():
    cfg = glyph_mlrc_config()
    cfg["transforms"] = {"train": [{"ToTensor": {}}]}
    with pytest.raises(ConfigError, match="transforms: needs an 'eval' list"):
        builder.build_splits(cfg, 0)


def test_missing_weights_file_names_key_and_file(tmp_path):
    cfg = cub_config(tmp_path, dataset=copy.deepcopy(GLYPHS))
    cfg["models"]["trunk"] = {"ResNetTrunk": {"depth": 18, "weights_path": "w/r18.pth"}}
    with pytest.raises(FileNotFoundError) as err:
        builder.build_models(cfg, torch.device("cpu"))
    text = str(err.value)
    assert "models.trunk: ResNetTrunk" in text and str(tmp_path / "w" / "r18.pth") in text
    assert "Nothing is downloaded" in text


def test_compare_table_shows_concatenated_and_separated():
    runs = {
        name: {
            f"seed{i}": {
                "test": {
                    "concatenated": {"precision_at_1": 0.5 + i / 10 + d},
                    "separated": {"precision_at_1": 0.4 + i / 10 + d},
                }
            }
            for i in range(2)
        }
        for name, d in (("a", 0.0), ("b", 0.05))
    }
    summary = reporting.summarize(runs)
    assert summary["metrics"] == ["precision_at_1", "separated precision_at_1"]
    table = reporting.markdown_table(summary)
    assert "separated P@1" in table and "| P@1" in table
    assert summary["rows"]["b"]["separated precision_at_1"]["mean"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- run-folder policy


def cub_mlrc_config(data_root, seed=0) -> dict:
    """The MLRC protocol on the tiny CUB fixture (4 folds, 2 epochs of 1 iteration)."""
    write_cub(data_root)
    cfg = cub_config(
        data_root,
        dataset={"CUB200": {"root": "CUB_200_2011", "split": "all"}},
        split={"mlrc_protocol": {"num_folds": 4}},
        transforms=copy.deepcopy(TRANSFORMS),
    )
    cfg["seed"] = seed
    return cfg


def _files(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_R1_mlrc_into_a_used_folder_is_refused_unless_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    first = runner.train(cub_mlrc_config(tmp_path), run, stop_after_epoch=1)
    assert first == {"interrupted_after_epoch": 1, "fold": 0}
    before = _files(run)
    with pytest.raises(RunFolderError, match=rf"{run} already holds an MLRC run .*--overwrite"):
        runner.train(cub_mlrc_config(tmp_path, seed=5), run, stop_after_epoch=1)
    assert _files(run) == before  # refused: nothing touched
    cfg_file = tmp_path / "mlrc.yaml"
    dump_yaml(cub_mlrc_config(tmp_path, seed=5), cfg_file)
    capsys.readouterr()
    assert main(["train", str(cfg_file), "--out", str(run)]) == 1
    assert f"pml-rank: error: {run} already holds an MLRC run" in capsys.readouterr().err
    runner.train(cub_mlrc_config(tmp_path, seed=5), run, stop_after_epoch=1, overwrite=True)
    assert load_yaml(run / "fold0" / "config.yaml")["seed"] == 5


def test_R1_mlrc_overwrite_keeps_user_folders(tmp_path):
    run = tmp_path / "run"
    runner.train(cub_mlrc_config(tmp_path), run, stop_after_epoch=1)
    (run / "fold1" / "checkpoints").mkdir(parents=True)  # an old fold's output
    (run / "fold1" / "checkpoints" / "latest.pt").write_bytes(b"old")
    user = [run / "folders_backup" / "keep.txt", run / "fold0" / "notes.txt", run / "fold9" / "x"]
    for p in user:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("mine")
    runner.train(cub_mlrc_config(tmp_path, seed=5), run, stop_after_epoch=1, overwrite=True)
    assert all(p.read_text() == "mine" for p in user)
    assert not (run / "fold1" / "checkpoints").exists()  # the old run's fold output went
    assert load_yaml(run / "config.yaml")["seed"] == 5


def test_R1_two_concurrent_mlrc_trains_one_is_refused(tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = cub_mlrc_config(tmp_path)
    second: list[BaseException] = []
    train_run = mlrc.train_run

    def first_fold_then_second_train(*args, **kwargs):
        if not second:  # while the first MLRC train runs fold 0, a second one starts
            try:
                runner.train(cub_mlrc_config(tmp_path), run, overwrite=True)
            except RunFolderBusy as e:
                second.append(e)
        return train_run(*args, **kwargs)

    monkeypatch.setattr(mlrc, "train_run", first_fold_then_second_train)
    m = runner.train(cfg, run, stop_after_epoch=1)
    assert m == {"interrupted_after_epoch": 1, "fold": 0}  # the first one ran on
    assert len(second) == 1 and f"{run} is in use by another run (pid {os.getpid()})" in str(
        second[0]
    )
    assert (run / "fold0" / "checkpoints" / "latest.pt").is_file()


def test_protocol_history_is_the_mean_over_folds_of_each_epoch():
    # Three folds; fold 2 stopped early after epoch 1 (its epoch 2 is absent, not zero).
    def row(epoch, val):
        return {"epoch": epoch, "validation": {"val": {"p": val, "q": 1 - val}}}

    histories = [
        [row(1, 0.2), row(2, 0.5)],
        [row(1, 0.4), row(2, 0.7)],
        [row(1, 0.9)],
    ]
    got = mlrc._mean_history(histories)
    assert [r["epoch"] for r in got] == [1, 2]
    assert got[0]["validation"]["val"]["p"] == pytest.approx((0.2 + 0.4 + 0.9) / 3)
    assert got[0]["validation"]["val"]["q"] == pytest.approx((0.8 + 0.6 + 0.1) / 3)
    assert got[1]["validation"]["val"]["p"] == pytest.approx((0.5 + 0.7) / 2)
    # an epoch without validation (test_interval) contributes nothing
    assert mlrc._mean_history([[{"epoch": 1, "train_loss": 0.3}], [row(1, 0.6)]]) == [
        {"epoch": 1, "validation": {"val": {"p": 0.6, "q": pytest.approx(0.4)}}}
    ]


def test_protocol_best_is_the_mean_of_the_folds_best_values(tmp_path, monkeypatch):
    # The folds' own runs replaced by results with distinct best values (a tiny real run scores
    # 1.0 on every fold, which cannot tell a mean from one fold's value).
    best = [(3, 0.2), (1, 0.5), (2, 0.6), (3, 0.9)]

    def fake_train_run(config, run_dir, *args, **kwargs):
        epoch, value = best[config["split"]["fold"]]
        history = [{"epoch": e, "validation": {"val": {"p": value}}} for e in range(1, 4)]
        return {
            "epochs_run": 3,
            "stopped_early": False,
            "best": {"epoch": epoch, "value": value},
            "history": history,
            "test": {"test": {"p": value}},
        }

    monkeypatch.setattr(mlrc, "train_run", fake_train_run)
    monkeypatch.setattr(
        mlrc, "mlrc_test", lambda *a, **k: {"test": {}, "embedding_dim": {"concatenated": 0}}
    )
    metrics = mlrc.train_mlrc(glyph_mlrc_config(), tmp_path)
    assert metrics["best"]["epoch"] == [3, 1, 2, 3]
    assert metrics["best"]["value"] == pytest.approx(np.mean([v for _, v in best]))
    assert metrics["history"][0]["validation"]["val"]["p"] == pytest.approx(0.55)
