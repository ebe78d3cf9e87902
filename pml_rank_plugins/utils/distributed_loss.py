"""Drop-ins for PML's ``DistributedLossWrapper`` / ``DistributedMinerWrapper`` that are exact.

``R`` processes (DDP), rank ``r`` embedding its ``n_r`` items; the **global batch** is the
concatenation of the ranks' items in rank order (``N = sum_r n_r``). Exact means: the loss value
on every rank is the one-process loss of the global batch, and after DDP averages the parameter
gradients over the ranks they are the one-process gradients (float64: to rounding, <= 1e-10).

* ``efficient=False``: every rank gathers the global batch (its own rows differentiable, their
  gradient scaled by ``R`` for DDP's averaging: :func:`~.distributed.all_gather_with_grad`) and
  computes the whole loss. Memory per rank: the loss of ``N`` queries (``O(N^2)`` pair scores
  for a dense loss). Any loss works, ``CrossBatchMemory`` included.
* ``efficient=True``: rank ``r`` computes only its own ``n_r`` queries against the ``N``
  gathered references (``O(n_r N)``), and the gradients of the references go back to the ranks
  that own them (:func:`~.distributed.all_gather_to_owners`). The global loss is a sum over
  queries, ``L = sum_r L_r``, once each rank's reduction divides by the **global** count (the
  valid queries of FastAP / mAP_Q, the nonzero pairs of ``AvgNonZeroReducer``...): the loss's
  reducer is swapped for the call by one that sums the local elements and divides by the counts
  all-reduced over the ranks (``MeanReducer``, ``AvgNonZeroReducer`` / ``ThresholdReducer``,
  ``SumReducer``; any other reducer, a query weighting that depends on the whole batch
  (``class_balanced`` mAP_Q, RankedList ``query_weighting="weight_share"``) or a loss that
  returns a non-zero ``already_reduced`` value: ``ValueError``). The batch's own lists leave each
  query's own column out (``self_index`` for this package's losses, PML's
  ``remove_self_comparisons`` pairs for PML's).

Why PML's wrapper differs (measured in docs/distributed.md): PML's ``efficient=True`` gathers the
other ranks' rows **without** gradient and multiplies the loss by ``R``, which assumes each pair's
two ends give its two halves of the gradient. A list-wise loss ranks a query's whole list: the
reference side of FastAP gives a gradient that differs from the query side's, and RankedList with
``gallery_gradient=False`` gives the references none at all (so PML's ``R`` doubles its gradient).
Its mean over local queries is divided by the local count too. PML's ``efficient=False`` computes
the whole loss on every rank and is exact in gradient; its value is ``R`` times the loss.

Returned value: the one-process loss (PML's wrapper returns ``R`` times it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory
from pytorch_metric_learning.reducers import (
    AvgNonZeroReducer,
    MeanReducer,
    MultipleReducers,
    SumReducer,
    ThresholdReducer,
)
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from .distributed import (
    all_gather_rows,
    all_gather_to_owners,
    all_gather_with_grad,
    is_initialized,
    world_size,
)
from .loss_and_miner_utils import WeightedPairs, memory_contents, takes_self_index

__all__ = ["DistributedLossWrapper", "DistributedMinerWrapper"]

# The reducers whose reduction is a sum over elements divided by a count (or not divided).
SPLITTABLE_REDUCERS = (MeanReducer, SumReducer, AvgNonZeroReducer, ThresholdReducer)


def _gather_labels(labels: torch.Tensor | None, device) -> torch.Tensor | None:
    if labels is None:
        return None
    return all_gather_rows(torch.as_tensor(labels, device=device))[0]


def _check_splittable(loss: torch.nn.Module) -> None:
    """``ValueError`` for what ``efficient=True`` cannot split over ranks exactly."""
    if getattr(loss, "class_balanced", False):
        raise ValueError(
            f"{type(loss).__name__}(class_balanced=True) weights each query by the class counts "
            "of the whole batch, which efficient=True does not see: use efficient=False"
        )
    if getattr(loss, "query_weighting", "mean") != "mean":
        raise ValueError(
            f"{type(loss).__name__}(query_weighting={loss.query_weighting!r}) normalizes the "
            "query weights over the whole batch, which efficient=True does not see: use "
            "efficient=False"
        )
    reducer = getattr(loss, "reducer", None)
    subs = [reducer]
    if isinstance(reducer, MultipleReducers):
        subs = [*reducer.reducers.values(), reducer.default_reducer]
    for sub in subs:
        if type(sub) not in SPLITTABLE_REDUCERS:
            raise ValueError(
                f"efficient=True splits the reduction over ranks for MeanReducer, SumReducer, "
                f"AvgNonZeroReducer and ThresholdReducer; {type(loss).__name__} uses "
                f"{type(sub).__name__}: use efficient=False"
            )


class _SplitReducer(torch.nn.Module):
    """The loss's reducer, reduced over the ranks: per sub-loss ``sum(local elements) / global
    count`` (``SumReducer``: no division); summing these partial values over the ranks gives the
    one-process reduction. One all-reduce of the counts per call."""

    def __init__(self, reducer: torch.nn.Module):
        super().__init__()
        self.inner = reducer

    def _sub(self, name: str) -> torch.nn.Module:
        inner = self.inner
        if isinstance(inner, MultipleReducers):
            return inner.reducers[name] if name in inner.reducers else inner.default_reducer
        return inner

    def forward(self, loss_dict: dict, embeddings: torch.Tensor, labels) -> torch.Tensor:
        names = sorted(loss_dict)
        sums, counts = [], []
        for name in names:
            info = loss_dict[name]
            losses, kind, reducer = info["losses"], info["reduction_type"], self._sub(name)
            if not torch.is_tensor(losses):  # PML's zero_losses(): the int 0
                if losses != 0:
                    raise ValueError(f"sub-loss {name!r} is a non-zero number: cannot split it")
                sums.append(torch.sum(embeddings * 0))
                counts.append(0.0)
                continue
            if kind == "already_reduced":
                # A connected zero (nothing to rank on this rank) contributes nothing; any other
                # reduced value cannot be split into per-query parts.
                if float(losses.detach().abs().sum()) != 0.0:
                    raise ValueError(
                        f"{name!r} is already reduced by the loss; efficient=True cannot split "
                        "it over ranks: use efficient=False"
                    )
                sums.append(losses.sum())
                counts.append(0.0)
                continue
            if isinstance(reducer, ThresholdReducer):
                keep = torch.ones_like(losses, dtype=torch.bool)
                if reducer.low is not None:
                    keep &= losses > reducer.low
                if reducer.high is not None:
                    keep &= losses < reducer.high
                sums.append(torch.where(keep, losses, 0).sum())
                counts.append(keep.sum().item())
            elif type(reducer) is MeanReducer:
                sums.append(losses.sum())
                counts.append(float(losses.numel()))
            else:  # SumReducer
                sums.append(losses.sum())
                counts.append(None)
        total_counts = torch.tensor(
            [0.0 if c is None else c for c in counts], dtype=torch.float64, device=embeddings.device
        )
        dist.all_reduce(total_counts)
        out = torch.sum(embeddings * 0)
        for value, count, total in zip(sums, counts, total_counts.tolist()):
            if count is None:
                out = out + value
            elif total > 0:
                out = out + value / total
            else:
                out = out + value * 0
        return out


def _exact_value(partial: torch.Tensor, world: int) -> torch.Tensor:
    """Value ``sum_r partial_r`` (all-reduced), gradient ``world * d partial`` (DDP averages)."""
    total = partial.detach().clone()
    dist.all_reduce(total)
    return total + world * (partial - partial.detach())


class DistributedLossWrapper(torch.nn.Module):
    """PML's ``DistributedLossWrapper(loss, efficient=False)``, exact in both modes.

    Args:
        loss: a PML loss (``BaseMetricLossFunction``, this package's losses included) or a
            ``CrossBatchMemory`` (PML's or :class:`pml_rank_plugins.losses.CrossBatchMemory`).
        efficient: ``False``: each rank computes the whole global-batch loss (``O(N^2)``).
            ``True``: each rank computes its own queries against the gathered batch
            (``O(n_r N)``); see the module docstring for what it refuses.

    Call: ``wrapper(embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None,
    enqueue_mask=None)`` with this rank's ``(n_r, D)`` embeddings and ``(n_r,)`` labels (and its
    share of ``ref_emb`` / ``ref_labels``, gathered the same way); ``enqueue_mask`` only with a
    ``CrossBatchMemory``. ``indices_tuple`` indexes what the loss sees, i.e. what
    :class:`DistributedMinerWrapper` with the same ``efficient`` returns: the global batch
    (``efficient=False``), or this rank's queries against the global batch (``True``).
    ``labels=None`` with an ``indices_tuple`` (PML's wrapper accepts it, as PML's own distributed
    test calls it): the loss gets no labels, for a loss that reads only the tuples (PML's pair and
    triplet losses; this package's list-wise losses need labels and say so); without an
    ``indices_tuple``, or with a ``CrossBatchMemory``, labels are required (``ValueError``).

    Returns:
        The one-process loss of the global batch (same value on every rank); its gradient is
        ``R`` times this rank's share, so that DDP's average over ranks is the one-process
        gradient. Without an initialized process group: ``loss(...)`` itself.
    """

    def __init__(self, loss: torch.nn.Module, efficient: bool = False):
        super().__init__()
        if (
            not isinstance(loss, torch.nn.Module)
            or not hasattr(loss, "reducer")
            and not (isinstance(loss, PMLCrossBatchMemory))
        ):
            raise TypeError(
                "DistributedLossWrapper wraps a PML loss or CrossBatchMemory, got "
                f"{type(loss).__name__}"
            )
        self.loss, self.efficient = loss, bool(efficient)
        if self.efficient:
            inner = loss.loss if isinstance(loss, PMLCrossBatchMemory) else loss
            _check_splittable(inner)

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices_tuple=None,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
        enqueue_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        memory = isinstance(self.loss, PMLCrossBatchMemory)
        if memory and (ref_emb is not None or ref_labels is not None):
            raise ValueError("CrossBatchMemory is not compatible with ref_emb and ref_labels")
        if enqueue_mask is not None and not memory:
            raise ValueError("enqueue_mask is for a CrossBatchMemory only")
        if not is_initialized() or world_size() == 1:
            if memory:
                return self.loss(embeddings, labels, indices_tuple, enqueue_mask)
            return self.loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        if labels is None and (memory or indices_tuple is None):
            # PML's contract: labels may be left out when indices_tuple says which tuples to use
            # (what DistributedMinerWrapper returned); the memory stores labels, the batch's own
            # tuples are made from them
            need = "CrossBatchMemory stores them" if memory else "or pass an indices_tuple"
            raise ValueError(f"labels are required ({need})")
        device = embeddings.device
        if not self.efficient:
            emb, lab = all_gather_with_grad(embeddings), _gather_labels(labels, device)
            if memory:
                return self.loss(emb, lab, indices_tuple, _gather_labels(enqueue_mask, device))
            if ref_emb is not None:
                ref_emb, ref_labels = all_gather_with_grad(ref_emb), _gather_labels(
                    ref_labels, device
                )
            return self.loss(emb, lab, indices_tuple, ref_emb, ref_labels)
        if memory:
            return self._memory_efficient(embeddings, labels, indices_tuple, enqueue_mask)
        return self._efficient(embeddings, labels, indices_tuple, ref_emb, ref_labels)

    def _efficient(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        if labels is not None:  # None: the loss reads only indices_tuple (checked in forward)
            labels = torch.as_tensor(labels, device=embeddings.device)
        kwargs = {}
        if ref_emb is not None:
            refs, _ = all_gather_to_owners(ref_emb)
            ref_labels = _gather_labels(ref_labels, embeddings.device)
        else:
            refs, rows = all_gather_to_owners(embeddings)
            ref_labels = _gather_labels(labels, embeddings.device)
            if indices_tuple is None:  # the batch's own lists: leave each query's column out
                own = torch.arange(rows.start, rows.stop, device=embeddings.device)
                if takes_self_index(self.loss.forward, self.loss.compute_loss):
                    kwargs["self_index"] = own
                else:
                    indices_tuple = lmu.remove_self_comparisons(
                        lmu.get_all_pairs_indices(labels, ref_labels), own, len(ref_labels)
                    )
        reducer = self.loss.reducer
        self.loss.reducer = _SplitReducer(reducer)
        try:
            partial = self.loss(embeddings, labels, indices_tuple, refs, ref_labels, **kwargs)
        finally:
            self.loss.reducer = reducer
        return _exact_value(partial, world_size())

    def _memory_efficient(self, embeddings, labels, indices_tuple, enqueue_mask):
        """This rank's queries against the memory that holds the whole global batch."""
        memory = self.loss
        if indices_tuple is not None or enqueue_mask is not None:
            raise ValueError(
                "CrossBatchMemory with efficient=True takes no indices_tuple or enqueue_mask: use "
                "efficient=False"
            )
        loss, miner = memory.loss, memory.miner
        if not takes_self_index(loss.forward, loss.compute_loss) or (
            miner is not None and not takes_self_index(miner.forward, miner.mine)
        ):
            raise ValueError(
                "CrossBatchMemory with efficient=True needs a loss (and miner) of this package "
                "(they take self_index); with PML's losses use efficient=False"
            )
        device = embeddings.device
        labels = torch.as_tensor(labels, device=device)
        all_emb, rows = all_gather_rows(embeddings.detach())
        all_labels = _gather_labels(labels, device)
        # PML's CrossBatchMemory.forward up to the memory update, for the global batch (the same
        # queue on every rank), then only this rank's rows as queries.
        memory.reset_stats()
        memory.embedding_memory = memory.embedding_memory.to(device=device, dtype=all_emb.dtype)
        memory.label_memory = memory.label_memory.to(device=device, dtype=all_labels.dtype)
        if len(all_emb) > memory.memory_size:
            raise ValueError(
                f"a global batch of {len(all_emb)} embeddings does not fit in the memory "
                f"(memory_size={memory.memory_size}): use memory_size >= the global batch size"
            )
        memory.add_to_memory(all_emb, all_labels, len(all_emb))
        e_mem, l_mem = memory_contents(memory)
        self_index = memory.curr_batch_idx[rows]
        reducer = loss.reducer
        loss.reducer = _SplitReducer(reducer)
        try:
            if miner is None:
                partial = loss(embeddings, labels, None, e_mem, l_mem, self_index=self_index)
            else:
                pairs = miner(embeddings, labels, e_mem, l_mem, self_index=self_index)
                partial = loss(embeddings, labels, pairs, e_mem, l_mem)
        finally:
            loss.reducer = reducer
        return _exact_value(partial, world_size())


class DistributedMinerWrapper(torch.nn.Module):
    """PML's ``DistributedMinerWrapper(miner, efficient=False)``, in the order of
    :class:`DistributedLossWrapper`.

    ``efficient=False``: the miner runs on the global batch (rank order) and its indices index
    it. ``efficient=True``: it mines this rank's queries against the global batch, each query's
    own column left out (``self_index`` for this package's miner, whose pair weights are kept;
    PML's ``remove_self_comparisons`` otherwise). Pass the result to the loss wrapper with the
    same ``efficient``. Without a process group: ``miner(...)`` itself.
    """

    def __init__(self, miner: torch.nn.Module, efficient: bool = False):
        super().__init__()
        if not hasattr(miner, "mine"):
            raise TypeError(
                f"DistributedMinerWrapper wraps a PML miner, got {type(miner).__name__}"
            )
        self.miner, self.efficient = miner, bool(efficient)

    def forward(self, embeddings, labels, ref_emb=None, ref_labels=None):
        if not is_initialized() or world_size() == 1:
            return self.miner(embeddings, labels, ref_emb, ref_labels)
        device = embeddings.device
        emb, rows = all_gather_rows(embeddings.detach())
        lab = _gather_labels(labels, device)
        if ref_emb is not None:
            ref_emb = all_gather_rows(ref_emb.detach())[0]
            ref_labels = _gather_labels(ref_labels, device)
        if not self.efficient:
            return self.miner(emb, lab, ref_emb, ref_labels)
        if ref_emb is not None:
            return self.miner(embeddings, labels, ref_emb, ref_labels)
        own = torch.arange(rows.start, rows.stop, device=device)
        if takes_self_index(self.miner.forward, self.miner.mine):
            return self.miner(embeddings, labels, emb, lab, self_index=own)
        pairs = self.miner(embeddings, labels, emb, lab)
        weights = getattr(pairs, "weights", None)
        pairs = lmu.remove_self_comparisons(pairs, own, len(lab))
        return pairs if weights is None else WeightedPairs(*pairs, weights=weights)
