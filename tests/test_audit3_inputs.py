"""Third audit, items 8-12: bad configs, stores and values end in one line naming the file, key
or URL (exit 2 for a config mistake, 1 for a run or storage failure), never a traceback."""

from __future__ import annotations

import copy
import sqlite3

import pytest
import yaml

from pml_rank_plugins.cli import main
from tests.running.test_tune import (  # noqa: F401 (fixtures)
    glyph_config,
    workers_in_process,
)


def write(tmp_path, cfg, name="c.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def one_method(**edits) -> dict:
    cfg = glyph_config()
    cfg["methods"].pop("PML Contrastive")
    for key, value in edits.items():
        cfg[key] = value
    return cfg


def one_line(capsys, *words) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("optimizers=5", "optimizers"),
        ("split=5", "split"),
        ("transforms=[1]", "transforms"),
        ("tune=3", "tune"),
        ("eval=[]", "eval"),
        ("methods=5", "methods"),
        ("trainer=x", "trainer"),
        ("optimizers.trunk_optimizer=5", "optimizers.trunk_optimizer"),
    ],
)
def test_config_sections_that_are_not_mappings_exit_2_naming_the_key(
    tmp_path, capsys, assignment, key
):
    path = write(tmp_path, one_method())
    assert main(["check", path, "--set", assignment]) == 2
    one_line(capsys, key)


def test_a_methods_tune_that_is_not_a_mapping_exits_2(tmp_path, capsys):
    cfg = one_method()
    cfg["methods"]["plugin FastAP"]["tune"] = 5
    assert main(["check", write(tmp_path, cfg)]) == 2
    one_line(capsys, "methods.plugin FastAP.tune")


def test_a_space_bound_of_10_to_the_400_exits_2(tmp_path, capsys):
    cfg = one_method()
    cfg["tune"]["space"] = {"optimizers.trunk_optimizer.lr": {"float": [1e-4, 10**400]}}
    assert main(["check", write(tmp_path, cfg)]) == 2
    one_line(capsys, "optimizers.trunk_optimizer.lr")


def test_adam_betas_of_one_value_exit_2_naming_the_optimizer(tmp_path, capsys):
    cfg = one_method()
    cfg["optimizers"]["trunk_optimizer"]["Adam"]["betas"] = [0.9]
    assert main(["check", write(tmp_path, cfg)]) == 2
    one_line(capsys, "optimizers.trunk_optimizer")


def test_yaml_true_for_a_number_is_refused(tmp_path, capsys):
    cfg = one_method()
    cfg["models"]["trunk"]["ConvEmbedder"]["in_channels"] = True
    assert main(["check", write(tmp_path, cfg)]) == 2
    one_line(capsys, "in_channels", "boolean")


def test_config_device_is_checked_up_front(tmp_path, capsys):
    path = write(tmp_path, one_method(device="cuda:7"))
    messages = set()
    for command in ("train", "compare", "tune", "check"):
        out = ["--out", str(tmp_path / command)] if command != "check" else []
        assert main([command, path, *out]) == 2
        messages.add(one_line(capsys, "device cuda:7", "not available here", "--device cpu"))
        assert not (tmp_path / command).exists()
    assert len(messages) == 1, messages  # check and train never disagree: one message
    grid = ["--method", "plugin FastAP", "--grid", "trainer.batch_size=12"]
    assert main(["sweep", path, *grid, "--out", str(tmp_path / "sweep")]) == 2
    one_line(capsys, "device cuda:7", "not available here")
    assert not (tmp_path / "sweep").exists()
    # --device checks a config written for another machine on this one (the CPU)
    assert main(["check", path, "--device", "cpu"]) == 0


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine as one with a single CUDA device (cuda:0), whatever it has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.usefixtures("one_gpu")
def test_check_and_train_refuse_the_same_missing_device(tmp_path, capsys):
    path = write(tmp_path, one_method())
    messages = []
    for command in ("check", "train"):
        out = ["--out", str(tmp_path / command)] if command == "train" else []
        assert main([command, path, "--set", "device=cuda:1", *out]) == 2
        messages.append(one_line(capsys, "device cuda:1", "available: cpu, cuda:0"))
    assert messages[0] == messages[1]
    assert not (tmp_path / "train").exists()


@pytest.mark.usefixtures("one_gpu")
def test_check_accepts_a_device_the_machine_has(tmp_path, capsys):
    path = write(tmp_path, one_method(device="cuda:0"))
    for device in ("cuda:0", "cuda"):  # passes train's device check; check builds on the CPU
        assert main(["check", path, "--set", f"device={device}"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["text", "random", "truncated", "directory", "zero_header"])
def test_a_corrupt_tune_db_is_one_line_naming_the_storage(tmp_path, capsys, kind):
    out = tmp_path / "t"
    out.mkdir()
    db = out / "tune.db"
    if kind == "text":
        db.write_text("not a database\n")
    elif kind == "random":
        db.write_bytes(bytes(range(256)) * 64)
    elif kind == "directory":
        db.mkdir()
    else:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
        data = bytearray(db.read_bytes())
        if kind == "truncated":
            data = data[:100]
        else:
            data[:16] = bytes(16)
        db.write_bytes(bytes(data))
    path = write(tmp_path, one_method())
    rc = main(["tune", path, "--out", str(out), "--trials", "1"])
    err = one_line(capsys, "tune.db")
    assert rc == 1, err
    assert not (out / "plugin_FastAP").exists()


def test_a_storage_url_that_cannot_connect_is_one_line(tmp_path, capsys):
    path = write(tmp_path, one_method())
    url = "postgresql+psycopg://u:secret@127.0.0.1:9/none"
    rc = main(["tune", path, "--out", str(tmp_path / "t"), "--storage", url])
    err = one_line(capsys, "127.0.0.1")
    assert rc in (1, 2) and "secret" not in err


def test_a_flipped_study_direction_is_refused(tmp_path, capsys):
    import optuna

    out = tmp_path / "t"
    out.mkdir()
    storage = f"sqlite:///{out / 'tune.db'}"
    optuna.create_study(storage=storage, study_name="plugin FastAP", direction="minimize")
    path = write(tmp_path, one_method())
    assert main(["tune", path, "--out", str(out), "--trials", "1"]) == 1
    one_line(capsys, "minimize")


@pytest.mark.slow
@pytest.mark.usefixtures("workers_in_process", "png_plots_only")  # the exit status is tested
def test_every_failed_trial_makes_tune_exit_1(tmp_path, capsys):
    cfg = copy.deepcopy(one_method())
    cfg["trainer"]["MetricLossOnly"]["num_epochs"] = 1
    cfg["eval"]["validation"] = []  # no validation value: every trial fails
    path = write(tmp_path, cfg)
    assert main(["tune", path, "--out", str(tmp_path / "t"), "--trials", "1"]) == 1
    assert "no complete trial" in capsys.readouterr().err


def scalar_label_calls():
    """Every loss of ours (with and without chunking and gallery gradient) and the miner, each
    given a 0-D label tensor as ``labels`` or as ``ref_labels``."""
    import torch

    from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
    from pml_rank_plugins.miners import RankedListMiner

    objects = {
        "FastAP": lambda: FastAPLoss(num_bins=5),
        "FastAP chunked": lambda: FastAPLoss(num_bins=5, chunk_size=1),
        "mAP_Q": lambda: QuantizedAPLoss(num_bins=5),
        "mAP_Q chunked": lambda: QuantizedAPLoss(num_bins=5, chunk_size=1),
        "RankedList": lambda: RankedListLoss(),
        "RankedList chunked": lambda: RankedListLoss(chunk_size=1),
        "RankedList gallery": lambda: RankedListLoss(gallery_gradient=True),
        "RankedList gallery chunked": lambda: RankedListLoss(gallery_gradient=True, chunk_size=1),
        "RankedListMiner": lambda: RankedListMiner(),
    }
    emb = torch.randn(6, 4, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    scalar = torch.tensor(3)
    calls = {
        "labels": lambda f: f(emb, scalar),
        "ref_labels": lambda f: f(emb, labels, ref_emb=emb.detach(), ref_labels=scalar),
    }
    return [
        pytest.param(make, call, arg, id=f"{name}-{arg}")
        for name, make in objects.items()
        for arg, call in calls.items()
    ]


@pytest.mark.parametrize("make, call, argument", scalar_label_calls())
def test_scalar_labels_name_the_argument_and_the_expected_shape(make, call, argument):
    # was IndexError: tuple index out of range, from deep inside PML
    with pytest.raises(ValueError, match=rf"^{argument} must have shape \(N,\).*0-D"):
        call(make())


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("data_root=5", "data_root: expected a folder path"),
        ("mining_funcs.tuple_miner={TripletMarginMiner: {margin: x}}", "margin: expected a number"),
        ("dataset.GlyphDataset.image_size=x", "dataset.GlyphDataset.image_size: expected int"),
        ("tune.space=x", "tune.space: expected a mapping"),
    ],
)
def test_every_command_refuses_what_check_refuses(tmp_path, capsys, assignment, key):
    path = write(tmp_path, one_method())
    grid = ["--method", "plugin FastAP", "--grid", "trainer.batch_size=12"]
    messages = set()
    for command, extra in [("check", []), ("train", []), ("compare", []), ("tune", [])] + [
        ("sweep", grid)
    ]:
        out = [] if command == "check" else ["--out", str(tmp_path / command)]
        assert main([command, path, "--set", assignment, *out, *extra]) == 2, command
        messages.add(one_line(capsys, key))
        assert not (tmp_path / command).exists()
    assert len(messages) == 1, messages
