"""PML's SelfSupervisedLoss, accepting this plugin's list-wise losses too."""

from __future__ import annotations

from pytorch_metric_learning.losses import SelfSupervisedLoss as PMLSelfSupervisedLoss

from .cross_batch_memory import PLUGIN_LOSSES


class SelfSupervisedLoss(PMLSelfSupervisedLoss):
    """PML's ``SelfSupervisedLoss`` (``embeddings[i]`` and ``ref_emb[i]`` are two views of item
    ``i``, and no other pair matches), whose allow-list of loss class names also holds
    ``FastAPLoss``, ``QuantizedAPLoss`` and ``RankedListLoss``.

    PML 2.9.0 refuses every loss whose class name is not on its list: PML's
    ``SelfSupervisedLoss(FastAPLoss())`` raises "SelfSupervisedLoss not supported for
    FastAPLoss". Import this class instead; nothing else changes. The list is extended on this
    subclass only, never on PML's class (PML's list goes by class name, as for
    :class:`~pml_rank_plugins.losses.CrossBatchMemory`).

    Same arguments and ``forward(embeddings, ref_emb)`` as PML's class; the loss is PML's
    definition, with item labels ``arange(N)``:

    * ``symmetric=True`` (default): ``loss(cat([embeddings, ref_emb]), cat([arange(N),
      arange(N)]))``: each of the ``2N`` rows is a query whose one positive is its other view
      and whose ``2N - 2`` negatives are the other items' views;
    * ``symmetric=False``: ``loss(embeddings, arange(N), ref_emb=ref_emb,
      ref_labels=arange(N))``: each row of ``embeddings`` ranks the ``N`` rows of ``ref_emb``
      (one positive, ``N - 1`` negatives).

    For FastAP and mAP_Q a query with one positive has AP = the (soft) precision at its
    positive's rank, so the loss measures how often another item's view is closer than the
    item's own. ``N >= 2`` is needed for a query to have a negative (a query without one is
    handled as each loss documents).

    Example::

        from pml_rank_plugins.losses import FastAPLoss, SelfSupervisedLoss

        loss_fn = SelfSupervisedLoss(FastAPLoss(num_bins=10))
        loss = loss_fn(model(images), model(augment(images)))  # (N, D) each
    """

    @staticmethod
    def supported_losses() -> list[str]:
        return PMLSelfSupervisedLoss.supported_losses() + PLUGIN_LOSSES
