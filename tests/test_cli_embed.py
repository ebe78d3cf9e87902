"""``pml-rank embed`` (issue 29, item 3) on a tiny run trained here, its bad inputs (exit 2 naming
the path or key, nothing written), and ``compare --no-pictures`` (item 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import TensorDataset

from pml_rank_plugins.cli import main
from pml_rank_plugins.cli_args import build_parser
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import EvalTransform, embed, load_run, train
from tests.tiny import tiny_config

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("embed_run_dir")

TINY = {"trainer": {"MetricLossOnly": {"num_epochs": 1, "iterations_per_epoch": 2}}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("embed") / "run"
    train(tiny_config(**TINY), out)
    return out


def test_embed_writes_npz_with_metadata(run_dir, tmp_path, capsys):
    out = tmp_path / "test.npz"
    assert main(["embed", str(run_dir), "--split", "test", "--out", str(out)]) == 0
    want, want_labels = embed(load_run(run_dir), "test")
    with np.load(out, allow_pickle=False) as data:
        assert sorted(data.files) == ["checkpoint", "embeddings", "labels", "run_dir", "split"]
        np.testing.assert_array_equal(data["embeddings"], want)
        np.testing.assert_array_equal(data["labels"], want_labels)
        assert data["embeddings"].dtype == np.float32 and data["embeddings"].shape == (18, 16)
        assert str(data["split"]) == "test" and str(data["run_dir"]) == str(run_dir)
        assert str(data["checkpoint"]) == str(run_dir / "checkpoints" / "best.pt")
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == [str(out)] and report["shape"] == [18, 16]
    assert [p.name for p in tmp_path.iterdir()] == ["test.npz"]  # no temporary file left


def test_embed_writes_an_npy_pair_from_the_latest_checkpoint(run_dir, tmp_path, capsys):
    out = tmp_path / "val.npy"
    argv = ["embed", str(run_dir), "--split", "val", "--out", str(out), "--which", "latest"]
    assert main(argv + ["--device", "cpu"]) == 0
    want, want_labels = embed(load_run(run_dir, which="latest"), "val")
    np.testing.assert_array_equal(np.load(out), want)
    np.testing.assert_array_equal(np.load(tmp_path / "val_labels.npy"), want_labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.npy", "val_labels.npy"]
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoint"] == str(run_dir / "checkpoints" / "latest.pt")


def test_embed_bad_inputs_exit_2_naming_the_path_or_key_and_write_nothing(
    run_dir, tmp_path, capsys
):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    dump_yaml(tiny_config(**TINY), unfinished / "config.yaml")  # no checkpoint yet
    (tmp_path / "file").write_text("not a folder")
    outs = tmp_path / "outs"
    outs.mkdir()
    out = str(outs / "e.npz")
    cases = [
        ([str(tmp_path / "empty"), "--split", "test", "--out", out], "empty/config.yaml not found"),
        ([str(unfinished), "--split", "test", "--out", out], "latest.pt: no such checkpoint"),
        ([str(run_dir), "--split", "query", "--out", out], "query: not in"),
        ([str(run_dir), "--split", "query", "--out", out], "available: train, val, test"),
        ([str(run_dir), "--split", "test", "--out", str(tmp_path / "no/e.npz")], "no: not an"),
        ([str(run_dir), "--split", "test", "--out", str(tmp_path / "file/e.npz")], "file: not"),
        ([str(run_dir), "--split", "test", "--out", str(outs / "e.txt")], "e.txt: the output"),
        ([str(run_dir), "--split", "test", "--out", str(outs)], "must end in .npz or .npy"),
    ]
    (tmp_path / "empty").mkdir()
    for argv, message in cases:
        assert main(["embed", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("pml-rank: error: ") and message in err, (argv, err)
    assert list(outs.iterdir()) == [] and list((tmp_path / "empty").iterdir()) == []
    assert sorted(p.name for p in unfinished.iterdir()) == ["config.yaml"]


def test_embed_needs_split_or_images_and_out_with_split(capsys):
    for argv in (["embed", "runs/x", "--out", "e.npz"], ["embed", "runs/x"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        assert "one of the arguments --split --images is required" in capsys.readouterr().err
    assert main(["embed", "runs/x", "--split", "test"]) == 2
    assert "--out FILE is required with --split" in capsys.readouterr().err
    # both sources: one clear error from the parser
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["embed", "runs/x", "--split", "test", "--images", "d"])
    assert e.value.code == 2
    assert "--images: not allowed with argument --split" in capsys.readouterr().err


# -- own images (issue 41, item 3) ------------------------------------------------------------------
def _write_images(folder, images) -> list[str]:
    """``images`` (N, 1, 8, 8) in [0, 1] as 8-bit grayscale files, some in a subfolder and in
    other formats; returns their relative paths in the sorted order the command uses."""
    names = ["a.png", "b.BMP", "sub/c.png", "sub/deeper/d.tif", "z.webp"]
    for name, image in zip(names, images, strict=True):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = (image[0].clamp(0, 1).numpy() * 255).round().astype("uint8")
        Image.fromarray(pixels).save(path, **({"lossless": True} if name.endswith("webp") else {}))
    (folder / "notes.txt").write_text("not an image: skipped")
    return sorted(names)


def _quantized(images: torch.Tensor) -> torch.Tensor:
    return (images.clamp(0, 1) * 255).round() / 255


def test_embed_images_writes_embeddings_and_paths(run_dir, tmp_path, capsys):
    images = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    folder = tmp_path / "photos"
    names = _write_images(folder, images)
    out = tmp_path / "mine.npz"
    assert main(["embed", str(run_dir), "--images", str(folder), "--out", str(out)]) == 0
    loaded = load_run(run_dir)
    # The reference: the same pixels through the labeled path (the tiny run has no
    # transforms.eval: the datasets' conversion to a float tensor in [0, 1], grayscale).
    order = [["a.png", "b.BMP", "sub/c.png", "sub/deeper/d.tif", "z.webp"].index(n) for n in names]
    labeled = TensorDataset(_quantized(images[order]), torch.zeros(5, dtype=torch.long))
    want, _ = embed(loaded, labeled)
    with np.load(out, allow_pickle=False) as data:
        assert sorted(data.files) == ["checkpoint", "embeddings", "images", "paths", "run_dir"]
        assert list(data["paths"]) == names
        np.testing.assert_allclose(data["embeddings"], want, rtol=0, atol=1e-6)
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == [str(out)] and report["shape"] == [5, 16]


def test_loaded_run_exposes_its_eval_transform_and_embed_takes_unlabeled_data(run_dir):
    loaded = load_run(run_dir)
    assert loaded.eval_transform == EvalTransform("L", None)
    rgb = Image.new("RGB", (8, 8), (255, 0, 0))
    x = loaded.eval_transform(rgb)  # converted to the run's mode, then to a float tensor
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    images = torch.rand(7, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    want, _ = embed(loaded, TensorDataset(images, torch.zeros(7, dtype=torch.long)))
    one_tuple = embed(loaded, TensorDataset(images), batch_size=3)  # items (image,)
    np.testing.assert_allclose(one_tuple, want, rtol=0, atol=1e-6)

    class Plain(torch.utils.data.Dataset):  # items: a bare tensor
        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            return images[i]

    np.testing.assert_allclose(embed(loaded, Plain()), want, rtol=0, atol=1e-6)


def test_embed_images_errors_exit_2_and_write_nothing(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty, broken, outs = tmp_path / "empty", tmp_path / "broken", tmp_path / "outs"
    for folder in (empty, broken, outs):
        folder.mkdir()
    (empty / "readme.txt").write_text("no images here")
    _write_images(broken, torch.rand(5, 1, 8, 8))
    (broken / "sub" / "bad.jpg").write_text("not a jpeg")
    out = str(outs / "e.npz")
    cases = [
        (["--images", str(empty), "--out", out], "no image files found"),
        (["--images", str(tmp_path / "nowhere"), "--out", out], "nowhere: not a folder"),
        (["--images", str(broken), "--out", out], "bad.jpg: cannot read image"),
        (["--images", str(broken), "--out", str(outs / "e.npy")], "--images writes a .npz"),
    ]
    for argv, message in cases:
        assert main(["embed", str(run_dir), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("pml-rank: error: ") and message in err, (argv, err)
    assert list(outs.iterdir()) == []
    # the default output is written once, then never overwritten unless named
    good = tmp_path / "good"
    _write_images(good, torch.rand(5, 1, 8, 8))
    assert main(["embed", str(run_dir), "--images", str(good)]) == 0
    assert (tmp_path / "embeddings.npz").is_file()
    capsys.readouterr()
    assert main(["embed", str(run_dir), "--images", str(good)]) == 2
    assert "embeddings.npz exists" in capsys.readouterr().err


def test_compare_no_pictures_draws_none_and_keeps_existing_ones(tmp_path, png_plots_only):
    config = tmp_path / "tiny.yaml"
    dump_yaml(tiny_config(**TINY), config)
    out = tmp_path / "cmp"
    argv = ["compare", str(config), "--out", str(out), "--no-pictures"]
    assert main(argv) == 0
    assert (out / "comparison.md").is_file()
    assert not list(out.rglob("retrieval*")) and not list(out.rglob("worst_queries*"))
    assert "pictures" not in json.loads((out / "summary.json").read_text())
    # a picture drawn by an earlier compare survives `--resume --no-pictures`
    (method,) = [p for p in out.iterdir() if (p / "seed0").is_dir()]
    (method / "retrieval.png").write_bytes(b"earlier picture")
    assert main(argv + ["--resume"]) == 0
    assert (method / "retrieval.png").read_bytes() == b"earlier picture"
    assert build_parser().parse_args(["compare", "default"]).no_pictures is False
