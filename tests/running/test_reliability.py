"""Trust boundaries and faults of a run (issue 20 S2, R3-R6): checkpoints are read with
``weights_only=True`` and checked before loading, a full disk is one line and a record, a
non-finite model is never saved, a refused run touches nothing."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil

import pytest
import torch

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import checkpoints, runner
from pml_rank_plugins.running.checkpoints import CheckpointError, load_checkpoint, load_models
from pml_rank_plugins.running.nonfinite import NonFiniteError
from pml_rank_plugins.running.run_folder import DiskFullError, RunFolderError
from tests.tiny import TinyNet, tiny_config

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("reliability_partial")


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    """A run interrupted after epoch 1 of 2, with best.pt and latest.pt (copied per test)."""
    run = tmp_path_factory.mktemp("partial") / "run"
    runner.train(tiny_config(), run, stop_after_epoch=1)
    return run


def copy_run(partial_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(partial_run, run)
    return run


def test_every_checkpoint_we_write_loads_with_weights_only(partial_run):
    for name in ("latest.pt", "best.pt"):
        ckpt = torch.load(partial_run / "checkpoints" / name, weights_only=True)
        assert ckpt["epoch"] == 1 and "trunk" in ckpt["models"]
    latest = torch.load(partial_run / "checkpoints" / "latest.pt", weights_only=True)
    assert set(checkpoints.LATEST_KEYS) <= set(latest)


def test_plain_values_round_trip_exactly():
    import collections
    import random

    import numpy as np

    value = {
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "labels": [np.int64(3), np.float32(0.5)],
        "by_label": collections.defaultdict(list, {np.int64(2): np.arange(4)}),
        "set": {1, 2},
    }
    back = checkpoints.from_plain(checkpoints.to_plain(value))
    assert back["numpy_rng"][0] == "MT19937" and back["numpy_rng"][1].dtype == np.uint32
    assert np.array_equal(back["numpy_rng"][1], value["numpy_rng"][1])
    assert back["numpy_rng"][2:] == value["numpy_rng"][2:]
    assert back["python_rng"] == value["python_rng"]
    assert [type(v) for v in back["labels"]] == [np.int64, np.float32]
    assert isinstance(back["by_label"], collections.defaultdict)
    assert np.array_equal(back["by_label"][np.int64(2)], np.arange(4)) and back["set"] == {1, 2}
    with pytest.raises(CheckpointError, match=r"cannot store x.model: Linear"):
        checkpoints.to_plain({"model": torch.nn.Linear(1, 1)}, "x")


class Payload:
    """Unpickling this runs ``exec``: it would create ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


def test_S2_pickle_payload_in_latest_pt_is_refused_on_resume_and_eval(
    tmp_path, partial_run, capsys
):
    run = copy_run(partial_run, tmp_path)
    marker = tmp_path / "pwned"
    for name in ("latest.pt", "best.pt"):
        path = run / "checkpoints" / name
        ckpt = torch.load(path, weights_only=True)
        ckpt["extra"] = {"x": Payload(marker)}
        torch.save(ckpt, path)
    latest, best = run / "checkpoints" / "latest.pt", run / "checkpoints" / "best.pt"
    with pytest.raises(CheckpointError, match=rf"{latest}: refused: .*weights_only=True"):
        runner.train(None, run, resume=True)
    with pytest.raises(CheckpointError, match=rf"{best}: refused"):
        runner.evaluate(run)
    cfg = tmp_path / "c.yaml"
    dump_yaml(tiny_config(), cfg)
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(run), "--resume"]) == 1
    err = capsys.readouterr().err
    assert f"pml-rank: error: {latest}: refused" in err and "Traceback" not in err
    assert main(["eval", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"pml-rank: error: {best}: refused" in err and "Traceback" not in err
    assert not marker.exists()
    assert not (run / "eval.json").exists()
    torch.load(best, weights_only=False)  # the payload is real: the unsafe load runs it
    assert marker.exists()


def _write(path, obj):
    torch.save(obj, path)
    return path


def test_R5_checkpoint_without_models_is_refused(tmp_path, partial_run, capsys):
    run = copy_run(partial_run, tmp_path)
    latest = _write(run / "checkpoints" / "latest.pt", {"epoch": 1, "history": []})
    best = _write(run / "checkpoints" / "best.pt", {"epoch": 1})
    with pytest.raises(CheckpointError, match=rf"{latest}: not a pml-rank checkpoint .*'models'"):
        runner.train(None, run, resume=True)
    with pytest.raises(CheckpointError, match=rf"{best}: not a pml-rank checkpoint .*'models'"):
        runner.evaluate(run)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "change,match",
    [
        ("shape", r"models\.trunk\.fc\.weight has shape \[8, 64\] in the checkpoint, \[16, 64\]"),
        ("missing", r"missing key models\.trunk\.bn\.running_var"),
        ("unexpected", r"unexpected key models\.trunk\.head\.weight"),
        ("model", r"unexpected model models\.other"),
    ],
)
def test_R5_checkpoint_with_another_models_weights_is_refused(
    tmp_path, partial_run, change, match, capsys
):
    run = copy_run(partial_run, tmp_path)
    best = run / "checkpoints" / "best.pt"
    ckpt = torch.load(best, weights_only=True)
    trunk = ckpt["models"]["trunk"]
    if change == "shape":
        ckpt["models"]["trunk"] = TinyNet(embedding_dim=8).state_dict()
    elif change == "missing":
        del trunk["bn.running_var"]
    elif change == "unexpected":
        trunk["head.weight"] = torch.zeros(2)
    else:
        ckpt["models"]["other"] = {}
    _write(best, ckpt)
    with pytest.raises(CheckpointError, match=rf"^{best}: {match}"):
        runner.evaluate(run)
    models = {"trunk": TinyNet(), "embedder": torch.nn.Identity()}
    before = {k: v.clone() for k, v in models["trunk"].state_dict().items()}
    with pytest.raises(CheckpointError, match=match):
        load_models(models, best)
    after = models["trunk"].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing loaded
    capsys.readouterr()
    assert main(["eval", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"pml-rank: error: {best}: " in err and "Traceback" not in err
    assert not (run / "eval.json").exists()


def test_R5_checkpoint_with_empty_models_is_refused(tmp_path, partial_run, capsys):
    run = copy_run(partial_run, tmp_path)
    best = _write(run / "checkpoints" / "best.pt", {"epoch": 1, "models": {}})
    with pytest.raises(CheckpointError, match=rf"{best}: 'models' is empty, no model weights"):
        runner.evaluate(run)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 1
    assert f"{best}: 'models' is empty" in capsys.readouterr().err
    assert not (run / "eval.json").exists()


def _full_save(obj, f):
    f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_save_chained(obj, f):  # what torch.save raises on a real full disk
    try:
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # noqa: B904


@pytest.mark.parametrize("where", ["torch.save", "torch.save chained", "os.replace"])
def test_R3_disk_full_is_one_line_and_recorded(tmp_path, monkeypatch, capsys, where):
    run = tmp_path / "run"
    best = run / "checkpoints" / "best.pt"
    if where == "os.replace":
        replace = os.replace

        def full_replace(src, dst, *args, **kwargs):
            if str(dst).endswith(".pt"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", full_replace)
    else:
        monkeypatch.setattr(
            torch, "save", _full_save if where == "torch.save" else _full_save_chained
        )
    with pytest.raises(DiskFullError, match=rf"^No space left on device: {best}$"):
        runner.train(tiny_config(), run)
    m = json.loads((run / "metrics.json").read_text())
    assert m["status"] == "failed" and f"No space left on device: {best}" in m["error"]
    assert not list((run / "checkpoints").glob(".*.tmp"))  # the partial file is removed
    cfg = tmp_path / "c.yaml"
    dump_yaml(tiny_config(), cfg)
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(tmp_path / "cli")]) == 1
    err = capsys.readouterr().err
    line = f"pml-rank: error: No space left on device: {tmp_path / 'cli' / 'checkpoints'}"
    assert line in err and "Traceback" not in err and "enforce fail" not in err


class InfBNNet(TinyNet):
    """TinyNet whose BatchNorm ``running_var`` turns inf in the first iteration of epoch 2 (3
    iterations per epoch) while the loss and the gradients stay finite, as after an LR blow-up."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.train_calls = 0

    def forward(self, x):
        out = super().forward(x)
        if self.training:
            self.train_calls += 1
            if self.train_calls == 4:  # a new buffer: autograd saved the old one for backward
                self.bn.running_var = torch.full_like(self.bn.running_var, float("inf"))
        return out


registry.register("InfBNNet", InfBNNet)


def test_R4_non_finite_buffers_are_never_saved_as_latest(tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(models={"trunk": {"InfBNNet": {"embedding_dim": 16}}})
    with pytest.raises(
        NonFiniteError, match=r"after epoch 2: trunk\.bn\.running_var has NaN or inf"
    ):
        runner.train(cfg, run)
    latest = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert latest["epoch"] == 1  # the last good one stays
    for name in ("latest.pt", "best.pt"):
        state = load_checkpoint(run / "checkpoints" / name)["models"]["trunk"]
        assert all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())
    m = json.loads((run / "metrics.json").read_text())
    assert m["status"] == "failed" and "trunk.bn.running_var" in m["error"]
    assert m["failed_in_epoch"] == 2


def test_R4_non_finite_embedding_names_epoch_and_iteration(tmp_path):
    cfg = tiny_config(optimizers={"trunk_optimizer": {"SGD": {"lr": 1.0e38}}})
    cfg["eval"]["validation"], cfg["eval"]["test"] = [], []
    cfg["loss_funcs"]["metric_loss"] = {"pml_rank_plugins.FastAPLoss": {}}
    run = tmp_path / "run"
    with pytest.raises(
        NonFiniteError, match=r"^non-finite embeddings at epoch 1, iteration \d of 3: \d+ of"
    ) as info:
        runner.train(cfg, run)
    assert isinstance(info.value.__cause__, ValueError)  # the loss's own refusal, kept
    m = json.loads((run / "metrics.json").read_text())
    assert m["status"] == "failed"
    assert m["error"].startswith("NonFiniteError: non-finite embeddings at epoch 1")


def test_R6_refused_run_deletes_nothing(tmp_path, partial_run):
    run = copy_run(partial_run, tmp_path)
    ours = run / "checkpoints" / ".latest.pt.k1ll3d.tmp"  # a killed write's leftover
    ours.write_bytes(b"half a checkpoint")
    users = [run / ".notes.tmp", run / "notes" / ".draft.tmp", run / "checkpoints" / ".mine.tmp"]
    for p in users:
        p.parent.mkdir(exist_ok=True)
        p.write_text("user file")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(RunFolderError, match="already holds a partial run"):
        runner.train(tiny_config(seed=5), run)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    runner.train(None, run, resume=True)  # accepted: only our leftover goes
    assert not ours.exists()
    assert all(p.read_text() == "user file" for p in users)
