"""PML's CrossBatchMemory, accepting this plugin's list-wise losses too."""

from __future__ import annotations

from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..functional.validation import check_int, check_label_values, check_labels
from ..utils.loss_and_miner_utils import WeightedPairs, memory_contents, takes_self_index

PLUGIN_LOSSES = ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss"]


def check_memory_labels(embeddings, labels) -> None:
    """The label checks of this package's losses, run before anything touches the memory (PML's
    class writes the labels first, then fails with an ``AttributeError`` or a shape mismatch):
    a tensor of class ids (:func:`check_labels`), given, 1-D with one label per embedding (PML's
    ``check_shapes`` messages), without NaN, inf or fractions (:func:`check_label_values`).
    Labels on another device are moved to the embeddings' device, as PML's losses do."""
    check_labels(labels, "labels")
    c_f.labels_required(labels)
    c_f.check_shapes(embeddings, labels)
    check_label_values(labels, "labels")


class CrossBatchMemory(PMLCrossBatchMemory):
    """PML's ``CrossBatchMemory`` (rank each batch against a queue of past embeddings), whose
    allow-list of loss class names also holds ``FastAPLoss``, ``QuantizedAPLoss`` and
    ``RankedListLoss`` (PML 2.9.0 rejects any name not on its list, ours included: PML's
    ``CrossBatchMemory(FastAPLoss())`` raises "CrossBatchMemory not supported for FastAPLoss";
    importing this class instead is the whole fix). The list is extended on this subclass only,
    never on PML's class: PML's allow-list goes by class name, and PML's own ``FastAPLoss`` /
    ``RankedListLoss`` (which refuse ``ref_emb``) must stay refused there.

    Same arguments as PML's class. Two paths, with equal values and gradients:

    * **self-index path** (the fast one): when the loss takes a ``self_index`` (this package's
      ``FastAPLoss``, ``QuantizedAPLoss``, ``RankedListLoss``), there is no extra
      ``indices_tuple``, and the miner is ``None`` or takes a ``self_index`` too
      (``RankedListMiner``), the loss is called with ``ref_emb`` / ``ref_labels`` = the memory and
      ``self_index`` = the memory slots the batch was just written to: each query is ranked
      against the whole memory but its own slot, pair categories derived from the labels chunk by
      chunk (no ``batch x memory`` index tuple). A miner is called the same way and its pairs
      handed to the loss. With ``enqueue_mask`` the queries (the rows not enqueued) are in no
      slot, and nothing is left out (as in PML);
    * **PML's path** otherwise (PML's losses, other miners, an extra ``indices_tuple``): PML
      passes the memory together with an ``indices_tuple`` of all (query, memory) pairs (or the
      miner's) minus each query's own slot, and our losses restrict every ranked list to exactly
      those pairs.

    One difference of the self-index path: a batch of a single embedding leaves its own slot out
    too (PML 2.9's ``remove_self_comparisons`` misses it when the batch has one row).

    Differences from PML's class:

    * a miner's :class:`~pml_rank_plugins.utils.loss_and_miner_utils.WeightedPairs` (e.g.
      ``RankedListMiner``'s negative weights) keeps its ``.weights`` through the removal of
      self-comparisons (PML returns a plain tuple, so ``RankedListLoss`` silently fell back to
      its own ``Tn``); combining weighted pairs with an extra ``indices_tuple`` is a
      ``ValueError`` (the extra pairs would have no weight);
    * ``labels`` checked before the memory is touched, with the messages of this package's
      losses (``check_memory_labels``: a list, ``None``, ``(N, 2)``, a wrong length, NaN /
      inf / fractional values); PML raises ``AttributeError`` or a shape mismatch;
    * a clear ``ValueError`` at the call for a batch (or ``enqueue_mask`` selection) larger than
      ``memory_size`` (PML: a bare ``AssertionError``, or silent overwriting), embeddings whose
      width is not ``embedding_size``, and non-integer sizes.
    """

    def __init__(self, loss, embedding_size, memory_size=1024, miner=None, **kwargs):
        embedding_size = check_int(embedding_size, "embedding_size", minimum=1)
        memory_size = check_int(memory_size, "memory_size", minimum=1)
        super().__init__(loss, embedding_size, memory_size=memory_size, miner=miner, **kwargs)

    @staticmethod
    def supported_losses():
        return PMLCrossBatchMemory.supported_losses() + PLUGIN_LOSSES

    def forward(self, embeddings, labels, indices_tuple=None, enqueue_mask=None):
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be 2-D (N, D), got shape {tuple(embeddings.shape)}")
        if embeddings.shape[1] != self.embedding_size:
            raise ValueError(
                f"CrossBatchMemory got embeddings of width {embeddings.shape[1]}, but its memory "
                f"holds embedding_size={self.embedding_size} columns"
            )
        check_memory_labels(embeddings, labels)
        if enqueue_mask is not None:
            if len(enqueue_mask) != len(embeddings):
                raise ValueError(
                    f"enqueue_mask has {len(enqueue_mask)} entries for {len(embeddings)} embeddings"
                )
            enqueued = int(enqueue_mask.sum())
            if enqueued > self.memory_size:
                raise ValueError(
                    f"enqueue_mask would enqueue {enqueued} embeddings, more than "
                    f"memory_size={self.memory_size}: use memory_size >= the number enqueued"
                )
        elif len(embeddings) > self.memory_size:
            raise ValueError(
                f"a batch of {len(embeddings)} embeddings does not fit in the memory "
                f"(memory_size={self.memory_size}): use memory_size >= the batch size"
            )
        if indices_tuple is not None or not self._takes_self_index():
            return super().forward(embeddings, labels, indices_tuple, enqueue_mask)
        return self._forward_self_index(embeddings, labels, enqueue_mask)

    def add_to_memory(self, embeddings, labels, batch_size):
        # PML's forward casts the memory to the embeddings' dtype only outside autocast, and its
        # test (torch.is_autocast_enabled() without a device type) reads CUDA's autocast state:
        # under CUDA autocast the memory stays float32 while the embeddings are bf16 / fp16, and
        # the index put refused the mix. The queue is written in the memory's dtype.
        embeddings = embeddings.to(self.embedding_memory.dtype)
        super().add_to_memory(embeddings, labels, batch_size)

    def _takes_self_index(self) -> bool:
        """Whether the loss (and the miner, if any) accept ``self_index``: checked per call, so a
        loss or miner swapped after construction is handled too."""
        if not takes_self_index(self.loss.forward, self.loss.compute_loss):
            return False
        return self.miner is None or takes_self_index(self.miner.forward, self.miner.mine)

    def _forward_self_index(self, embeddings, labels, enqueue_mask):
        # PML 2.9's CrossBatchMemory.forward up to the memory update (same queue, same state),
        # then the memory and the slots of the batch instead of an indices_tuple.
        self.reset_stats()
        device = embeddings.device
        labels = c_f.to_device(labels, device=device)
        self.embedding_memory = c_f.to_device(
            self.embedding_memory, device=device, dtype=embeddings.dtype
        )
        self.label_memory = c_f.to_device(self.label_memory, device=device, dtype=labels.dtype)
        if enqueue_mask is not None:
            emb_for_queue, labels_for_queue = embeddings[enqueue_mask], labels[enqueue_mask]
            embeddings, labels = embeddings[~enqueue_mask], labels[~enqueue_mask]
        else:
            emb_for_queue, labels_for_queue = embeddings, labels
        self.add_to_memory(emb_for_queue, labels_for_queue, len(emb_for_queue))
        E_mem, L_mem = memory_contents(self)
        # The queries were written to curr_batch_idx (< queue_idx until the memory wraps, when
        # E_mem becomes the whole memory); with enqueue_mask the queries are the rows not
        # enqueued, in no slot.
        self_index = self.curr_batch_idx if enqueue_mask is None else None
        if self.miner is None:
            return self.loss(embeddings, labels, None, E_mem, L_mem, self_index=self_index)
        pairs = self.miner(embeddings, labels, E_mem, L_mem, self_index=self_index)
        return self.loss(embeddings, labels, pairs, E_mem, L_mem)

    def create_indices_tuple(
        self, embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove_self_comparisons
    ):
        # PML's method, keeping a miner's WeightedPairs (and its .weights) intact.
        if self.miner:
            indices_tuple = self.miner(embeddings, labels, E_mem, L_mem)
        else:
            indices_tuple = lmu.get_all_pairs_indices(labels, L_mem)
        weights = getattr(indices_tuple, "weights", None)
        if do_remove_self_comparisons:
            indices_tuple = lmu.remove_self_comparisons(
                indices_tuple, self.curr_batch_idx, self.memory_size
            )
        if weights is not None:
            # Self-comparisons are same-label pairs: only (a1, p) are filtered, the negative
            # pairs (a2, n) that the weights align with are kept as they are.
            if len(indices_tuple) != 4 or len(indices_tuple[3]) != len(weights):
                raise RuntimeError(
                    "removing self-comparisons changed the negative pairs; cannot keep the "
                    "miner's weights aligned"
                )
            if input_indices_tuple is not None:
                raise ValueError(
                    "the miner returned weighted pairs (.weights); an extra indices_tuple cannot "
                    "be combined with them (its pairs would have no weight): pass indices_tuple="
                    "None, or use a miner without weights"
                )
            return WeightedPairs(*indices_tuple, weights=weights)
        if input_indices_tuple is not None:
            if len(input_indices_tuple) == 3 and len(indices_tuple) == 4:
                input_indices_tuple = lmu.convert_to_pairs(input_indices_tuple, labels)
            elif len(input_indices_tuple) == 4 and len(indices_tuple) == 3:
                input_indices_tuple = lmu.convert_to_triplets(input_indices_tuple, labels)
            indices_tuple = c_f.concatenate_indices_tuples(indices_tuple, input_indices_tuple)
        return indices_tuple
