"""PML trainers that run data-parallel (``torch.distributed``) and in mixed precision.

Data parallel with a **global** batch (world size ``R``, batch ``B`` = ``trainer.batch_size``):

1. every rank draws the same global batch of ``B`` items from the sampler (same seed, same
   sampler state, RNG states kept equal by the runner) and embeds only its contiguous slice
   ``torch.tensor_split(range(B), R)[rank]`` (``B/R`` items, ``R`` slices of any sizes);
2. the embeddings are all-gathered in rank order, so every rank holds the global ``(B, d)``
   embedding matrix in the sampler's order, with its own rows still attached to the graph;
   labels need no gathering (every rank has the global batch's labels);
3. every rank runs the miners and the loss on the global batch (any PML loss or miner, ours and
   PML's, ``CrossBatchMemory`` included) and computes the same loss value;
4. gradient scaling: rank ``r``'s local rows receive ``dL/dE_r`` (the single-process gradient of
   those rows); ``_ScaleGrad`` multiplies it by ``R``, and DDP averages the parameter gradients
   over ranks, giving ``(1/R) sum_r R J_r^T dL/dE_r = sum_r J_r^T dL/dE_r`` -- exactly the
   single-process gradient of the global-batch loss. Loss parameters (proxies) are not wrapped in
   DDP: every rank computes their full gradient itself.

So an ``R``-process run equals the one-process run of the same config, up to float rounding, as
long as the model is the same function of each item whatever its batch companions: no dropout
(its masks would differ) and BatchNorm frozen (``freeze_trunk_batchnorm``, eval mode) -- train-mode
BatchNorm normalizes each rank's slice by that slice's statistics. Memory per rank: the slice's
activations plus the ``(B, d)`` embeddings; compute per rank: ``B/R`` forward/backward items plus
the full ``O(B^2)`` loss (duplicated on every rank; it is small next to the network).

``ChunkedMetricLossOnly`` works the same way: each rank embeds its slice chunk by chunk, and
:class:`~pml_rank_plugins.trainers.chunked_backward.ChunkedEmbedding` gathers and scales (the
same recipe).

Mixed precision (``amp={"dtype": torch.bfloat16 | torch.float16}``): the models run under
``torch.autocast``; their embeddings are cast to float32 before gathering, mining and the loss, so
every loss computes in float32. float16 uses a ``torch.amp.GradScaler`` (the trainer's
``grad_scaler``): the loss is scaled before backward, gradients are unscaled before clipping, and
optimizer steps with inf/NaN gradients are skipped.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from pytorch_metric_learning.trainers import MetricLossOnly

from ..utils.distributed import all_gather_with_grad
from ._dist import is_initialized, rank, world_size
from .chunked_metric_loss_only import ChunkedMetricLossOnly

AMP_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = [
    "AMP_DTYPES",
    "DistributedChunkedMetricLossOnly",
    "DistributedMetricLossOnly",
    "DistributedTrainerMixin",
    "all_gather_with_grad",
    "distributed_trainer_class",
    "is_initialized",
    "local_slice",
    "make_grad_scaler",
    "parse_amp",
    "rank",
    "world_size",
    "wrap_ddp",
]


def local_slice(n: int) -> slice:
    """This rank's contiguous slice of a global batch of ``n`` items (``tensor_split`` sizes)."""
    world = world_size()
    if world == 1:
        return slice(0, n)
    if n < world:
        raise ValueError(
            f"global batch of {n} items cannot be split over {world} processes; "
            f"set trainer.batch_size >= {world} (it is the global batch)"
        )
    own = rank()
    base, extra = divmod(n, world)
    start = own * base + min(own, extra)
    return slice(start, start + base + (1 if own < extra else 0))


def parse_amp(amp: Any) -> dict | None:
    """``None`` or ``{"dtype": "bfloat16" | "float16"}`` -> ``None`` or ``{"dtype": torch dtype}``.

    Raises ``ValueError`` naming the accepted values otherwise.
    """
    if amp is None:
        return None
    if not isinstance(amp, dict) or set(amp) - {"dtype"} or "dtype" not in amp:
        raise ValueError(
            f"amp must be {{dtype: bfloat16}} or {{dtype: float16}} (or null), got {amp!r}"
        )
    dtype = amp["dtype"]
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    if dtype not in AMP_DTYPES:
        raise ValueError(f"amp.dtype must be one of {sorted(AMP_DTYPES)}, got {amp['dtype']!r}")
    return {"dtype": AMP_DTYPES[dtype]}


def make_grad_scaler(amp: dict | None, device: torch.device) -> torch.amp.GradScaler | None:
    """A ``GradScaler`` for float16 autocast, ``None`` otherwise (bfloat16 needs no scaling)."""
    amp = parse_amp(amp)
    if amp is None or amp["dtype"] != torch.float16:
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def wrap_ddp(models: dict, device: torch.device, frozen=()) -> dict:
    """``DistributedDataParallel`` around every model with trainable parameters (not in
    ``frozen``); the others (``Identity`` embedders, frozen models) stay as they are.
    One process: ``models`` unchanged."""
    if world_size() == 1:
        return dict(models)
    device = torch.device(device)
    ids = None
    if device.type == "cuda":
        ids = [device.index if device.index is not None else torch.cuda.current_device()]
    out = {}
    for name, model in models.items():
        trainable = any(p.requires_grad for p in model.parameters())
        if trainable and name not in frozen:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        out[name] = model
    return out


class DistributedTrainerMixin:
    """Put before a PML trainer class: global-batch data parallelism and mixed precision.

    Args:
        amp: ``None`` or ``{"dtype": "bfloat16" | "float16"}`` (autocast for the models).
        grad_scaler: the ``torch.amp.GradScaler`` for float16 (``make_grad_scaler``); it is
            created here when ``amp`` asks for float16 and none is given.
        *args: the trainer's.
        **kwargs: the trainer's. ``batch_size`` is the global batch; models should be
            wrapped in DDP by the caller (:func:`wrap_ddp`) when torch.distributed is initialized.
    """

    def __init__(self, *args, amp: Any = None, grad_scaler=None, **kwargs):
        self.amp = parse_amp(amp)
        self.grad_scaler = grad_scaler
        self._gather_embeddings = False
        super().__init__(*args, **kwargs)
        if self.grad_scaler is None and self.amp is not None:
            self.grad_scaler = make_grad_scaler(amp, self.data_device)

    @property
    def _embeds_in_chunks(self) -> bool:
        return isinstance(self, ChunkedMetricLossOnly)

    def calculate_loss(self, curr_batch):
        data, labels = curr_batch
        if world_size() == 1:
            return super().calculate_loss(curr_batch)
        if not torch.is_tensor(data):
            raise TypeError(
                f"distributed training slices the batch's data tensor; got {type(data).__name__}"
            )
        part = local_slice(len(data))
        if self._embeds_in_chunks:  # ChunkedEmbedding gathers embeddings and labels itself
            return super().calculate_loss((data[part], labels[part]))
        self._gather_embeddings = True
        try:
            return super().calculate_loss((data[part], labels))
        finally:
            self._gather_embeddings = False

    def compute_embeddings(self, data):
        if self.amp is None:
            embeddings = super().compute_embeddings(data)
        else:
            device_type = torch.device(self.data_device).type
            with torch.autocast(device_type, dtype=self.amp["dtype"]):
                embeddings = super().compute_embeddings(data)
            embeddings = embeddings.float()  # losses and miners compute in float32
        if self._gather_embeddings:
            embeddings = all_gather_with_grad(embeddings)
        return embeddings

    def backward(self):
        total = self.losses["total_loss"]
        if self.grad_scaler is None or not getattr(total, "requires_grad", False):
            return super().backward()
        self.losses["total_loss"] = self.grad_scaler.scale(total)
        try:
            return super().backward()
        finally:
            self.losses["total_loss"] = total

    def _stepped_optimizers(self):
        for key, opt in self.optimizers.items():
            if re.sub("_optimizer$", "", key) not in self.freeze_these:
                yield opt

    def clip_gradients(self):
        if self.grad_scaler is not None and self.gradient_clippers:
            for opt in self._stepped_optimizers():
                self.grad_scaler.unscale_(opt)
        super().clip_gradients()

    def step_optimizers(self):
        if self.grad_scaler is None:
            return super().step_optimizers()
        for opt in self._stepped_optimizers():
            self.grad_scaler.step(opt)
        self.grad_scaler.update()


class DistributedMetricLossOnly(DistributedTrainerMixin, MetricLossOnly):
    """PML's ``MetricLossOnly`` with a global batch split over ranks and optional autocast."""


class DistributedChunkedMetricLossOnly(DistributedTrainerMixin, ChunkedMetricLossOnly):
    """``ChunkedMetricLossOnly`` with a global batch split over ranks (each rank chunks its
    slice) and optional autocast."""


_CLASSES: dict[type, type] = {
    MetricLossOnly: DistributedMetricLossOnly,
    ChunkedMetricLossOnly: DistributedChunkedMetricLossOnly,
}


def distributed_trainer_class(cls: type) -> type:
    """The :class:`DistributedTrainerMixin` subclass of PML trainer class ``cls`` (cached)."""
    if issubclass(cls, DistributedTrainerMixin):
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            f"Distributed{cls.__name__}",
            (DistributedTrainerMixin, cls),
            {"__module__": __name__, "__doc__": f"{cls.__name__} + DistributedTrainerMixin."},
        )
    return _CLASSES[cls]
