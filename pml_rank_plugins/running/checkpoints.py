"""Checkpoints of a run: what is saved, atomic writes, safe reads, and which file to evaluate.

``latest.pt`` holds everything a resume needs (models, optimizers, schedulers, loss/miner state,
the sampler's state, every RNG state, the history); ``best.pt`` the model weights of the best
validation epoch. Everything is stored as tensors and plain Python values (numpy arrays and
scalars, e.g. numpy's RNG state, as tagged byte tensors, ``to_plain``), so every read is
``torch.load(weights_only=True)``: a file whose pickle needs anything else (a ``__reduce__``
payload that would run code) is refused, never unpickled. Writes are atomic
(:func:`atomic_torch_save`; a full disk is one line, :class:`.run_folder.DiskFullError`); reads
turn a truncated, empty, foreign or unsafe file into :class:`CheckpointError` naming the file and
the fix (:func:`load_checkpoint`); the model weights are checked against the models (names and
shapes, :func:`check_models`) before anything is loaded into them; :func:`choose_checkpoint` is
the one rule for which file evaluation, the MLRC test and the retrieval pictures use.
"""

from __future__ import annotations

import collections
import copy
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..experiment.builder import Experiment
from .run_folder import RunFolderError, disk_full_as_error


class CheckpointError(RunFolderError):
    """A checkpoint file cannot be read (truncated, empty, not a checkpoint)."""


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same folder, then ``os.replace`` (atomic).

    The temporary file is ``.NAME.<random>.tmp`` (what ``run_folder.remove_partial_writes``
    removes after a kill). A previous ``path`` stays intact when the write fails.

    Args:
        obj: what to save (tensors and plain values; see ``to_plain``).
        path: the destination file.

    Raises:
        DiskFullError: the disk filled up (``No space left on device: PATH``).
    """
    path = Path(path)
    with disk_full_as_error(path):
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


# --------------------------------------------------------------------------- plain values

# Marks a dict that stands for a value weights_only cannot hold (a numpy array, a set...).
TAG = "__pml_rank__"
_PLAIN = (type(None), bool, int, float, str)
_FACTORIES = {"list": list, "dict": dict, "set": set, "int": int, "float": float}


def to_plain(value: Any, where: str = "checkpoint") -> Any:
    """``value`` as tensors and plain values that ``torch.load(weights_only=True)`` reads.

    numpy arrays and scalars become ``{TAG: "ndarray", dtype, shape, data (uint8 tensor)}``
    (exact bytes, so RNG states round-trip bit for bit); sets, dicts with other keys than
    str/int and ``defaultdict`` become tagged item lists. :func:`from_plain` inverts it.

    Args:
        value: the value to convert (e.g. ``np.random.get_state()``, a sampler's attributes).
        where: its name in the checkpoint, for the error message.

    Returns:
        The converted value.

    Raises:
        CheckpointError: ``value`` holds something else (a module, a function, an object array).
    """
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.fields is not None:
            raise CheckpointError(f"cannot store {where}: numpy dtype {arr.dtype} holds objects")
        data = torch.from_numpy(np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8).copy())
        kind = "ndarray" if isinstance(value, np.ndarray) else "scalar"
        return {TAG: kind, "dtype": arr.dtype.str, "shape": list(arr.shape), "data": data}
    if isinstance(value, list):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(to_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (set, frozenset)):
        return {TAG: "set", "items": [to_plain(v, f"{where}{{}}") for v in sorted(value)]}
    if isinstance(value, dict):
        items = [
            (to_plain(k, f"{where} key"), to_plain(v, f"{where}.{k}")) for k, v in value.items()
        ]
        factory = getattr(value, "default_factory", None)
        if type(value) in (dict,) and all(type(k) in (str, int) and k != TAG for k, _ in items):
            return dict(items)
        name = None if factory is None else getattr(factory, "__name__", "")
        if name is not None and _FACTORIES.get(name) is not factory:
            raise CheckpointError(f"cannot store {where}: defaultdict of {factory!r}")
        return {TAG: "dict", "factory": name, "items": [list(kv) for kv in items]}
    raise CheckpointError(
        f"cannot store {where}: {type(value).__name__} is not a tensor or a plain value "
        "(checkpoints are read with torch.load(weights_only=True))"
    )


def from_plain(value: Any) -> Any:
    """Invert ``to_plain`` (numpy arrays and scalars, sets and dicts come back exactly)."""
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(from_plain(v) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: from_plain(v) for k, v in value.items()}
    if kind in ("ndarray", "scalar"):
        dtype = np.dtype(value["dtype"])
        if dtype.hasobject:
            raise CheckpointError(f"numpy dtype {dtype} holds objects; refused")
        arr = np.frombuffer(value["data"].numpy().tobytes(), dtype).reshape(value["shape"]).copy()
        return arr if kind == "ndarray" else arr[()]
    if kind == "set":
        return {from_plain(v) for v in value["items"]}
    items = [(from_plain(k), from_plain(v)) for k, v in value["items"]]
    if value["factory"] is None:
        return dict(items)
    return collections.defaultdict(_FACTORIES[value["factory"]], items)


# --------------------------------------------------------------------------- state


def rng_state() -> dict:
    """Every RNG state (torch, numpy, Python, CUDA) as plain values (``to_plain``)."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": to_plain(np.random.get_state(), "rng.numpy"),
        "python": to_plain(random.getstate(), "rng.python"),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(from_plain(state["numpy"]))
    random.setstate(from_plain(state["python"]))
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


# Top-level keys of ``latest.pt`` that a resume needs (``best.pt`` holds "epoch" and "models").
LATEST_KEYS = (
    "epoch",
    "models",
    "optimizers",
    "lr_schedulers",
    "loss_funcs",
    "mining_funcs",
    "rng",
    "history",
    "best",
)
WEIGHTS_KEYS = ("epoch", "models")


def make_checkpoint(exp: Experiment, epoch: int, history: list, best: dict) -> dict:
    """Everything a resume needs (:data:`LATEST_KEYS`), as tensors and plain values."""
    sampler = exp.sampler
    return {
        "epoch": epoch,
        "models": state_dicts(exp.models),
        "optimizers": state_dicts(exp.optimizers),
        "lr_schedulers": state_dicts(exp.lr_schedulers),
        "loss_funcs": state_dicts(exp.loss_funcs),
        "mining_funcs": state_dicts(exp.mining_funcs),
        "sampler": to_plain(sampler_state(sampler), "sampler"),
        "rng": rng_state(),
        "extra": state_dicts({k: v for k, v in exp.extra.items() if v is not None}),
        "history": to_plain(history, "history"),
        "best": to_plain(best, "best"),
    }


def restore_checkpoint(exp: Experiment, ckpt: dict, path: str | Path = "checkpoint") -> None:
    """Load ``latest.pt``'s content ``ckpt`` into ``exp`` (models checked first).

    Args:
        exp: the rebuilt experiment of the run.
        ckpt: what :func:`load_checkpoint` returned for ``path`` (with :data:`LATEST_KEYS`).
        path: the file ``ckpt`` came from, for the error message.

    Raises:
        CheckpointError: a key is missing or the weights do not fit the models (nothing is
            loaded then).
    """
    _require(ckpt, LATEST_KEYS, Path(path))
    check_models(exp.models, ckpt["models"], path)
    load_state_dicts(exp.models, ckpt["models"])
    load_state_dicts(exp.optimizers, ckpt["optimizers"])
    load_state_dicts(exp.lr_schedulers, ckpt["lr_schedulers"])
    load_state_dicts(exp.loss_funcs, ckpt["loss_funcs"])
    load_state_dicts(exp.mining_funcs, ckpt["mining_funcs"])
    load_sampler_state(exp.sampler, from_plain(ckpt.get("sampler")))
    load_state_dicts(exp.extra, ckpt.get("extra", {}))  # e.g. the float16 GradScaler
    set_rng_state(ckpt["rng"])


def check_models(models: dict, states: Any, path: str | Path = "checkpoint") -> None:
    """Raise :class:`CheckpointError` unless ``states`` fits ``models`` exactly.

    Every model of ``models`` (that has a ``state_dict``) must have an entry in ``states`` with
    the same parameter and buffer names and tensor shapes, and ``states`` must name no other
    model. The message names the file and the first wrong key.

    Args:
        models: ``{name: module}`` (e.g. ``exp.models``).
        states: the checkpoint's ``models`` entry.
        path: the checkpoint file, for the message.
    """
    fix = "it is a checkpoint of another model or config; evaluate it with the run that wrote it"
    if not isinstance(states, dict) or not states:
        what = "empty" if isinstance(states, dict) else f"a {type(states).__name__}"
        raise CheckpointError(f"{path}: 'models' is {what}, no model weights to load; {fix}")
    expected = state_dicts(models)
    for name in states:
        if name not in expected:
            raise CheckpointError(f"{path}: unexpected model models.{name}; {fix}")
    for name, want in expected.items():
        if name not in states:
            raise CheckpointError(f"{path}: missing model models.{name}; {fix}")
        got = states[name]
        if not isinstance(got, dict):
            raise CheckpointError(f"{path}: models.{name} is a {type(got).__name__}; {fix}")
        for key in want:
            if key not in got:
                raise CheckpointError(f"{path}: missing key models.{name}.{key}; {fix}")
        for key in got:
            if key not in want:
                raise CheckpointError(f"{path}: unexpected key models.{name}.{key}; {fix}")
        for key, w in want.items():
            g = got[key]
            if isinstance(w, torch.Tensor) and (
                not isinstance(g, torch.Tensor) or g.shape != w.shape
            ):
                shape = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
                raise CheckpointError(
                    f"{path}: models.{name}.{key} has shape {shape} in the checkpoint, "
                    f"{list(w.shape)} in the model; {fix}"
                )


_HINT = (
    "the file is truncated or corrupt (e.g. the disk filled up or it was copied partially). "
    "Delete it and resume from an earlier copy, or start the run again with --overwrite"
)


def load_checkpoint(path: str | Path, required: tuple[str, ...] = ("epoch",)) -> dict:
    """``torch.load(weights_only=True)`` a checkpoint to CPU.

    Args:
        path: the checkpoint file.
        required: top-level keys the checkpoint must have (a dict without them is someone else's
            file, not one of ours).

    Returns:
        The checkpoint dict.

    Raises:
        CheckpointError: the file is missing, empty, unreadable, needs more than
            ``weights_only=True`` allows (it could run code: never unpickled), or lacks a
            ``required`` key; the message names the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: checkpoint is empty: {_HINT}")
    try:
        ckpt: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        # A corrupt file reaches torch's zip reader and its (pure-Python) weights-only unpickler
        # at arbitrary bytes, so the failure can be of any type: EOFError, BadZipFile,
        # UnpicklingError, but also IndexError ("pop from empty list") or MemoryError (a
        # claimed storage of absurd size). Whatever it is, the file cannot be read; the message
        # keeps the original type.
        text = str(e)
        if "Weights only load failed" in text:
            # torch's message is many lines; its reason is the line after "WeightsUnpickler error"
            reason = text.split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            reason = reason.split(". ")[0]  # not torch's advice to allow-list the global
            raise CheckpointError(
                f"{path}: refused: the file needs more than torch.load(weights_only=True) "
                f"allows ({reason.rstrip('.')}), so loading it could run code. pml-rank writes "
                "only tensors and plain values; if the file is an older pml-rank checkpoint, "
                "start the run again with --overwrite"
            ) from None
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise CheckpointError(
            f"{path}: cannot be read as a checkpoint ({type(e).__name__}: {first}); {_HINT}"
        ) from e
    _require(ckpt, required, path)
    return ckpt


def _require(ckpt: Any, keys: tuple[str, ...], path: Path) -> None:
    missing = [k for k in keys if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a pml-rank checkpoint (missing {missing}); {_HINT}")


def choose_checkpoint(run_dir: str | Path, which: str = "best") -> Path:
    """``RUN_DIR/checkpoints/<which>.pt``, or ``latest.pt`` when that file does not exist (a run
    without validation has no ``best.pt``). The file is not read here: :func:`load_checkpoint`
    reports a missing or unreadable one."""
    folder = Path(run_dir) / "checkpoints"
    path = folder / f"{which}.pt"
    return path if path.exists() else folder / "latest.pt"


def load_models(models: dict, path: str | Path) -> dict:
    """Load the ``models`` weights of checkpoint ``path`` into ``models`` (by name, in place).

    The checkpoint's structure and every parameter name and shape are checked first
    (:func:`check_models`), so a wrong file changes nothing.

    Args:
        models: ``{name: module}`` to load into.
        path: the checkpoint file (``best.pt`` or ``latest.pt``).

    Returns:
        The checkpoint.

    Raises:
        CheckpointError: unreadable, unsafe, or not these models' weights (one line naming the
            file and the first wrong key).
    """
    ckpt = load_checkpoint(path, required=WEIGHTS_KEYS)
    check_models(models, ckpt["models"], path)
    load_state_dicts(models, ckpt["models"])
    return ckpt
