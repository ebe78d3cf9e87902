"""PML's MetricLossOnly trainer with exact chunked (multistage) backpropagation."""

from __future__ import annotations

from pytorch_metric_learning.trainers import MetricLossOnly

from .chunked_backward import ChunkedEmbedding, _check_chunk_size


class ChunkedMetricLossOnly(MetricLossOnly):
    """``MetricLossOnly`` whose batches may be far larger than activation memory.

    Each batch is embedded in chunks of ``chunk_size`` without a graph; miners and the loss see the
    full batch's embeddings; ``backward`` backpropagates the loss to the embeddings (and loss
    parameters), then replays each chunk with a graph and backpropagates its share; the optimizers
    step once per batch. Everything else is PML's: loss weights, miners, gradient clippers,
    schedulers, hooks, ``freeze_trunk_batchnorm`` (BatchNorm in eval mode makes the result
    independent of the chunk size). See :mod:`~pml_rank_plugins.trainers.chunked_backward` for the
    exactness guarantees (RNG replay, BatchNorm running statistics updated once per chunk) and the
    ``torch.distributed`` gradient scaling.

    Args:
        chunk_size: most items per chunk (> 0; chunks are balanced, e.g. 13 by 4 gives 4, 3, 3,
            3); ``batch_size`` is the full (per-rank) batch.
        check_replay: verify that replayed chunks reproduce the first pass's embeddings.
        *args: as PML's ``MetricLossOnly``.
        **kwargs: as PML's ``MetricLossOnly``.
    """

    def __init__(self, *args, chunk_size: int, check_replay: bool = False, **kwargs):
        self.chunk_size = _check_chunk_size(chunk_size)
        self.check_replay = check_replay
        self._chunked = None
        super().__init__(*args, **kwargs)

    def calculate_loss(self, curr_batch):
        data, labels = curr_batch
        self._chunked = ChunkedEmbedding(
            self.compute_embeddings, list(self.models.values()), self.chunk_size, self.check_replay
        )
        embeddings, labels = self._chunked.forward(data, labels)
        indices_tuple = self.maybe_mine_embeddings(embeddings, labels)
        self.losses["metric_loss"] = self.maybe_get_metric_loss(embeddings, labels, indices_tuple)

    def backward(self):
        total = self.losses["total_loss"]
        if getattr(total, "requires_grad", False):
            total.backward()
        self._chunked.backward()
        self._chunked = None
