"""Trainers (PML subclasses) and the exact chunked backward they use."""

from .chunked_backward import ChunkedEmbedding, all_gather_rows, chunked_backward
from .chunked_metric_loss_only import ChunkedMetricLossOnly

__all__ = ["ChunkedEmbedding", "ChunkedMetricLossOnly", "all_gather_rows", "chunked_backward"]
