"""Trainers (PML subclasses) and the exact chunked backward they use."""

from .chunked_backward import ChunkedEmbedding, all_gather_rows, chunked_backward
from .chunked_metric_loss_only import ChunkedMetricLossOnly
from .distributed import (
    DistributedChunkedMetricLossOnly,
    DistributedMetricLossOnly,
    DistributedTrainerMixin,
    all_gather_with_grad,
    distributed_trainer_class,
    wrap_ddp,
)

__all__ = [
    "ChunkedEmbedding",
    "ChunkedMetricLossOnly",
    "DistributedChunkedMetricLossOnly",
    "DistributedMetricLossOnly",
    "DistributedTrainerMixin",
    "all_gather_rows",
    "all_gather_with_grad",
    "chunked_backward",
    "distributed_trainer_class",
    "wrap_ddp",
]
