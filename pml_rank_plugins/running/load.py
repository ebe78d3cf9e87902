"""Using a trained model: load a run folder's models (:func:`load_run`), embed a split with them
(:func:`embed`) and save the embeddings (:func:`save_embeddings`, ``pml-rank embed``).

:func:`load_run` takes the route ``pml-rank eval`` takes
(:meth:`~pml_rank_plugins.experiment.RunSpec.load`,
:func:`pml_rank_plugins.experiment.build_experiment`, :func:`.checkpoints.choose_checkpoint`,
weights read with ``torch.load(weights_only=True)`` and checked against the models before they
are loaded) and hands back the trunk and embedder in eval mode, ready for PML's
``InferenceModel(trunk, embedder)``. Every split is built with the config's *evaluation*
transforms (``transforms.eval``), ``train`` included, as powerful-benchmarker evaluates: no
random augmentation in an embedding.

:func:`embed` embeds with the run's own tester (``eval.tester``, PML's
``GlobalEmbeddingSpaceTester`` by default), so the vectors are the ones the run's evaluation
scored: ``embedder(trunk(x))``, L2-normalized unless the config's tester sets
``normalize_embeddings: false`` (and reduced by its ``pca``, or the trunk output under its
``use_trunk_output``, when the config says so).
"""

from __future__ import annotations

import copy
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from ..data.labels import wrapped_datasets
from ..experiment import builder
from ..experiment.spec import RunSpec
from ..experiment.transforms import build_transforms, collate_for
from .checkpoints import (
    WEIGHTS_KEYS,
    CheckpointError,
    check_models,
    choose_checkpoint,
    load_checkpoint,
    load_state_dicts,
    rng_state,
    set_rng_state,
)
from .own_images import EvalTransform
from .run_folder import RunFolderError, disk_full_as_error

CHECKPOINTS = ("best", "latest")
SUFFIXES = (".npz", ".npy")


@dataclass(frozen=True)
class LoadedRun:
    """A trained run, ready to embed: what :func:`load_run` returns.

    ``trunk`` and ``embedder`` are the run's models (``torch.nn.Module``, in eval mode, on
    ``device``; ``embedder`` is ``torch.nn.Identity`` when the config has none); ``config`` is
    the run's ``config.yaml`` as saved (``data_root`` replaced when :func:`load_run` was given
    one); ``checkpoint`` is the file whose weights were loaded and ``epoch`` its epoch (1-based);
    ``datasets`` is ``{split name: dataset}`` built from the config, every split with the
    evaluation transforms; ``run_dir`` is the run folder; ``eval_transform`` maps a PIL image to
    the model's input as the run's evaluation did (:class:`~.own_images.EvalTransform`: the
    datasets' PIL mode, their ``prepare_image`` when they have one, then ``transforms.eval`` or
    the built-in conversion), e.g.
    ``loaded.eval_transform(PIL.Image.open("photo.jpg"))``.
    """

    trunk: torch.nn.Module
    embedder: torch.nn.Module
    config: dict
    checkpoint: Path
    epoch: int
    device: torch.device
    datasets: dict
    run_dir: Path
    eval_transform: EvalTransform | None = None


def load_run(
    run_dir: str | Path,
    which: str = "best",
    device: str | torch.device | None = None,
    data_root: str | Path | None = None,
) -> LoadedRun:
    """Rebuild a trained run's models from ``RUN_DIR/config.yaml`` and load a checkpoint.

    Args:
        run_dir: the ``--out`` of a ``pml-rank train`` run (one fold ``fold<k>`` of an MLRC run).
        which: ``"best"`` (``checkpoints/best.pt``; ``latest.pt`` when the run has no
            validation and so no ``best.pt``) or ``"latest"``.
        device: where the models go (default: the config's ``device``, else CPU).
        data_root: replaces the saved config's ``data_root`` (the data moved since training).

    Returns:
        A :class:`LoadedRun`. The global RNG states (torch, numpy, Python) are as before the call
        (building the experiment seeds them).

    Raises:
        RunFolderError: ``run_dir`` is not a run folder (no ``config.yaml``) or is the top
            folder of an MLRC run (one model per fold: load ``fold<k>``).
        CheckpointError: no checkpoint (the run never finished an epoch), or an unreadable,
            unsafe or foreign one; the message names the file.
        ValueError: ``which`` is neither ``"best"`` nor ``"latest"``.
    """
    run_dir = Path(run_dir)
    spec, path = _config_and_checkpoint(run_dir, which, data_root)
    config = spec.config
    ckpt = load_checkpoint(path, required=WEIGHTS_KEYS)  # before building: fails in a second
    state = rng_state()
    try:
        exp = builder.build_experiment(
            spec.with_config(_eval_transforms_everywhere(config)), device
        )
    finally:
        set_rng_state(state)
    check_models(exp.models, ckpt["models"], path)  # wrong weights: one line, nothing loaded
    load_state_dicts(exp.models, ckpt["models"])
    trunk, embedder = exp.models["trunk"].eval(), exp.models["embedder"].eval()
    epoch = int(ckpt["epoch"])
    steps = (build_transforms(config) or {}).get("eval")  # what every split above was built with
    transform = EvalTransform(_image_mode(exp.datasets), steps, _prepare_step(exp.datasets))
    return LoadedRun(
        trunk, embedder, config, path, epoch, exp.device, exp.datasets, run_dir, transform
    )


def _image_mode(datasets: Mapping) -> str:
    """The PIL mode the run's images are loaded in: a dataset's ``mode`` (``ImageListDataset``),
    else from the channels of the first item (1: ``"L"``, else ``"RGB"``)."""
    for dataset in datasets.values():
        mode = getattr(dataset, "mode", None)
        if isinstance(mode, str):
            return mode
    for dataset in datasets.values():
        if len(dataset):
            image = dataset[0][0]
            if isinstance(image, torch.Tensor) and image.ndim == 3:
                return "L" if image.shape[0] == 1 else "RGB"
    return "RGB"


def _prepare_step(datasets: Mapping):
    """The datasets' ``prepare_image`` (an image file -> the PIL image their transform sees, e.g.
    Omniglot's resize and inversion), following Subset wrappers; None when they have none."""
    for outer in datasets.values():
        for dataset in wrapped_datasets(outer):  # LabeledSubset(Subset(...)): a short chain
            if callable(getattr(dataset, "prepare_image", None)):
                return dataset.prepare_image
    return None


def _config_and_checkpoint(run_dir: Path, which: str, data_root) -> tuple[RunSpec, Path]:
    """The run's saved spec and the checkpoint :func:`load_run` loads (checked, not read)."""
    if which not in CHECKPOINTS:
        raise ValueError(f"which={which!r}: expected one of {list(CHECKPOINTS)}")
    spec = RunSpec.load(run_dir, data_root)
    if spec.protocol.all_folds:
        raise RunFolderError(
            f"{run_dir} is an MLRC protocol folder (one model per fold): load one fold, e.g. "
            f"{run_dir / 'fold0'}"
        )
    path = choose_checkpoint(run_dir, which)
    if not path.is_file():
        raise CheckpointError(
            f"{path}: no such checkpoint: {run_dir} is not a finished run (no checkpoints/"
            "best.pt or latest.pt); train it, or finish it with `pml-rank train --resume`"
        )
    return spec, path


def _eval_transforms_everywhere(config: Mapping) -> dict:
    """A copy of ``config`` whose ``train`` split uses ``transforms.eval`` too."""
    config = copy.deepcopy(config)
    spec = config.get("transforms")
    if isinstance(spec, dict) and "eval" in spec:
        spec["train"] = spec["eval"]
    return config


def embed(
    loaded: LoadedRun, dataset: torch.utils.data.Dataset | str, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
    """Embed ``dataset`` with a loaded run, as the run's tester does.

    PML's ``tester.get_all_embeddings`` with the run's ``eval.tester`` (so the same
    normalization, ``pca`` and ``use_trunk_output`` as the run's evaluation), in batches of
    ``batch_size`` under ``torch.no_grad``, models in eval mode. O(N) forward passes; the
    embeddings are gathered on the run's device, then copied to the CPU.

    Args:
        loaded: what :func:`load_run` returned.
        dataset: a dataset yielding ``(image, label)``; an **unlabeled** one yielding ``image``
            (a tensor) or ``(image,)`` (e.g. ``TensorDataset(images)``, or
            :class:`~.own_images.ImageFiles` with ``loaded.eval_transform``); or the name of one
            of the run's splits (``loaded.datasets[name]``, evaluation transforms).
        batch_size: images per forward pass (BatchNorm is in eval mode: it changes nothing but
            the float rounding).

    Returns:
        ``(embeddings, labels)``: float32 ``(N, D)`` (rows of norm 1 under the default tester)
        and the labels ``(N, L)`` in dataset order (``(N, 2)`` for this package's datasets:
        column 0 the class, column 1 the category). An unlabeled dataset: ``embeddings`` only.

    Raises:
        ValueError: ``dataset`` names no split of the run (the message lists them), or
            ``batch_size`` is not a positive int.
    """
    if isinstance(dataset, str):
        if dataset not in loaded.datasets:
            raise ValueError(
                f"split {dataset!r}: not a split of {loaded.run_dir}; available: "
                f"{', '.join(loaded.datasets)}"
            )
        where, dataset = f"split {dataset!r}", loaded.datasets[dataset]
    else:
        where = "dataset"
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected a positive int")
    unlabeled = len(dataset) > 0 and _is_unlabeled(dataset[0])
    if unlabeled:  # PML's tester unpacks (image, label): give every item a label 0
        dataset = _WithDummyLabels(dataset)
    tester = builder.build_tester(loaded.config, loaded.device)
    tester.batch_size = batch_size
    emb, labels = tester.get_all_embeddings(
        dataset, loaded.trunk, loaded.embedder, collate_fn=collate_for(dataset, where)
    )
    emb = emb.float().cpu().numpy()
    return emb if unlabeled else (emb, labels.cpu().numpy())


def _is_unlabeled(item) -> bool:
    return isinstance(item, torch.Tensor) or (isinstance(item, (tuple, list)) and len(item) == 1)


class _WithDummyLabels(torch.utils.data.Dataset):
    """``(image, 0)`` for each item of an unlabeled dataset (a tensor or a 1-tuple)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        item = self.dataset[index]
        image = item if isinstance(item, torch.Tensor) else item[0]
        return image, torch.zeros((), dtype=torch.long)


def embeddings_files(out: str | Path) -> list[Path]:
    """The files :func:`save_embeddings` writes for ``out``, after checking it can.

    ``FILE.npz`` is one file; ``FILE.npy`` is ``FILE.npy`` (embeddings) and ``FILE_labels.npy``.

    Raises:
        ValueError: another suffix, a folder where a file is wanted, or a parent that is not an
            existing writable folder (the message names the path).
    """
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise ValueError(f"{out}: the output must end in .npz or .npy")
    files = [out] if out.suffix == ".npz" else [out, out.with_name(f"{out.stem}_labels.npy")]
    if not out.parent.is_dir():
        raise ValueError(f"{out.parent}: not an existing folder (cannot write {out})")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise ValueError(f"{out.parent}: folder is not writable (cannot write {out})")
    for f in files:
        if f.is_dir():
            raise ValueError(f"{f}: is a folder (give a file name)")
    return files


def save_embeddings(
    out: str | Path,
    embeddings: np.ndarray,
    labels: np.ndarray | None,
    *,
    paths: list[str] | None = None,
    class_names: list[str] | None = None,
    category_names: list[str] | None = None,
    **metadata: str,
) -> list[Path]:
    """Write what :func:`embed` returned to ``out`` (``.npz`` or ``.npy``); atomic per file.

    ``.npz``: keys ``embeddings``, ``labels`` (unless ``None``), ``paths`` (when given: one
    string per row, e.g. the image files of ``pml-rank embed --images``), ``class_names`` and
    ``category_names`` (when given: ``class_names[id]`` names class ``id`` of ``labels``, e.g.
    an :class:`~pml_rank_plugins.data.ImageFolderDataset`'s folders) and one string per
    ``metadata`` keyword (e.g. ``split``, ``run_dir``, ``checkpoint``), readable with
    ``np.load(out)`` (no pickle). The names go to a ``.npz`` only.
    ``.npy``: ``FILE.npy`` (embeddings) and ``FILE_labels.npy`` (no metadata). Each file is
    written to a temporary file in the same folder, then renamed over its target: a failed
    write leaves neither a temporary nor a half-written file.

    Returns:
        The files written (:func:`embeddings_files`).

    Raises:
        ValueError: ``out`` cannot be written (see :func:`embeddings_files`), or ``paths`` /
            no ``labels`` with a ``.npy`` output (write a ``.npz``).
        OSError: the write failed (the message names ``out``).
    """
    files = embeddings_files(out)
    if files[0].suffix == ".npz":
        arrays = {k: np.asarray(str(v)) for k, v in metadata.items()}
        arrays["embeddings"] = embeddings
        if labels is not None:
            arrays["labels"] = labels
        if paths is not None:
            arrays["paths"] = np.asarray([str(p) for p in paths], dtype=str)
        for key, names in (("class_names", class_names), ("category_names", category_names)):
            if names:
                arrays[key] = np.asarray([str(n) for n in names], dtype=str)
        parts = [lambda f: np.savez(f, **arrays)]
    else:
        if paths is not None or labels is None:
            raise ValueError(f"{out}: embeddings with paths (or without labels) go to a .npz")
        parts = [lambda f: np.save(f, embeddings), lambda f: np.save(f, labels)]
    _write_atomically(out, files, parts)
    return files


def _write_atomically(out, files: list[Path], parts: list) -> None:
    """``parts[i](f)`` writes ``files[i]`` through a temporary file in its folder, renamed over
    the target once every part is written; a failure leaves no temporary behind."""
    temps: list[Path] = []
    try:
        with disk_full_as_error(out):
            for target, write in zip(files, parts):
                temps.append(target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp"))
                # os.open, not mkstemp: the file gets the umask's permissions, not 0600
                fd = os.open(temps[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                with os.fdopen(fd, "wb") as f:
                    write(f)
            for tmp, target in zip(temps, files):
                os.replace(tmp, target)
    except OSError as e:
        raise OSError(f"{out}: cannot write: {e.strerror or e}") from e
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
