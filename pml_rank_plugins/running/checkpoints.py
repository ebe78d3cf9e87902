"""Checkpoints of a run: what is saved, atomic writes, safe reads, and which file to evaluate.

``latest.pt`` holds everything a resume needs (models, optimizers, schedulers, loss/miner state,
the sampler's state, every RNG state, the history); ``best.pt`` the model weights of the best
validation epoch. Writes are atomic (:func:`atomic_torch_save`); reads turn a truncated, empty or
foreign file into :class:`CheckpointError` naming the file and the fix (:func:`load_checkpoint`);
:func:`choose_checkpoint` is the one rule for which file evaluation, the MLRC test and the
retrieval pictures use.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..experiment.builder import Experiment
from .run_folder import RunFolderError


class CheckpointError(RunFolderError):
    """A checkpoint file cannot be read (truncated, empty, not a checkpoint)."""


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same folder, then ``os.replace`` (atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def state_dicts(objs: dict) -> dict:
    return {k: v.state_dict() for k, v in objs.items() if hasattr(v, "state_dict")}


def load_state_dicts(objs: dict, states: dict) -> None:
    for k, s in states.items():
        if k in objs:
            objs[k].load_state_dict(s)


def sampler_state(sampler) -> Any:
    """The sampler's state: ``state_dict()`` if it has one, else a copy of its attributes.

    PML's ``MPerClassSampler`` reshuffles its own label list in place every epoch, so the
    sampler object itself carries state that the RNG states alone do not capture.
    """
    if sampler is None:
        return None
    if hasattr(sampler, "state_dict"):
        return {"state_dict": sampler.state_dict()}
    return {"attributes": copy.deepcopy(vars(sampler))}


def load_sampler_state(sampler, state) -> None:
    if sampler is None or state is None:
        return
    if "state_dict" in state:
        sampler.load_state_dict(state["state_dict"])
    else:
        vars(sampler).update(copy.deepcopy(state["attributes"]))


def make_checkpoint(exp: Experiment, epoch: int, history: list, best: dict) -> dict:
    sampler = exp.sampler
    return {
        "epoch": epoch,
        "models": state_dicts(exp.models),
        "optimizers": state_dicts(exp.optimizers),
        "lr_schedulers": state_dicts(exp.lr_schedulers),
        "loss_funcs": state_dicts(exp.loss_funcs),
        "mining_funcs": state_dicts(exp.mining_funcs),
        "sampler": sampler_state(sampler),
        "rng": rng_state(),
        "extra": state_dicts({k: v for k, v in exp.extra.items() if v is not None}),
        "history": history,
        "best": best,
    }


def restore_checkpoint(exp: Experiment, ckpt: dict) -> None:
    load_state_dicts(exp.models, ckpt["models"])
    load_state_dicts(exp.optimizers, ckpt["optimizers"])
    load_state_dicts(exp.lr_schedulers, ckpt["lr_schedulers"])
    load_state_dicts(exp.loss_funcs, ckpt["loss_funcs"])
    load_state_dicts(exp.mining_funcs, ckpt["mining_funcs"])
    load_sampler_state(exp.sampler, ckpt.get("sampler"))
    load_state_dicts(exp.extra, ckpt.get("extra", {}))  # e.g. the float16 GradScaler
    set_rng_state(ckpt["rng"])


# MemoryError: random bytes read as a legacy pickle can claim a storage of absurd size.
_UNREADABLE = (
    MemoryError,
    RuntimeError,
    EOFError,
    OSError,
    pickle.UnpicklingError,
    ValueError,
    zipfile.BadZipFile,
)


def load_checkpoint(path: str | Path, required: tuple[str, ...] = ("epoch",)) -> dict:
    """``torch.load`` a checkpoint to CPU; :class:`CheckpointError` if it cannot be read.

    ``required``: top-level keys the checkpoint must have (a dict without them is someone else's
    file, not one of ours).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    hint = (
        "the file is truncated or corrupt (e.g. the disk filled up or it was copied partially). "
        "Delete it and resume from an earlier copy, or start the run again with --overwrite"
    )
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: checkpoint is empty: {hint}")
    try:
        ckpt: Any = torch.load(path, map_location="cpu", weights_only=False)
    except _UNREADABLE as e:
        raise CheckpointError(
            f"{path}: cannot be read as a checkpoint ({type(e).__name__}: {e}); {hint}"
        ) from e
    missing = [k for k in required if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a pml-rank checkpoint (missing {missing}); {hint}")
    return ckpt


def choose_checkpoint(run_dir: str | Path, which: str = "best") -> Path:
    """``RUN_DIR/checkpoints/<which>.pt``, or ``latest.pt`` when that file does not exist (a run
    without validation has no ``best.pt``). The file is not read here: :func:`load_checkpoint`
    reports a missing or unreadable one."""
    folder = Path(run_dir) / "checkpoints"
    path = folder / f"{which}.pt"
    return path if path.exists() else folder / "latest.pt"


def load_models(models: dict, path: str | Path) -> dict:
    """Load the ``models`` weights of checkpoint ``path`` into ``models`` (by name, in place);
    returns the checkpoint. Unreadable files raise :class:`CheckpointError`."""
    ckpt = load_checkpoint(path)
    load_state_dicts(models, ckpt["models"])
    return ckpt
