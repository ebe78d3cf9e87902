"""The ``self_index`` keyword of the list-wise losses' ``forward`` (memory-bank fast path)."""

from __future__ import annotations

import torch
from pytorch_metric_learning.utils import common_functions as c_f

from ..functional.backend import checks_values
from ..functional.validation import (
    check_labels,
    check_ref_labels_pairing,
    clamp_indices_tuple,
    clamp_self_index,
    flag_non_finite,
)
from ..utils.loss_and_miner_utils import WeightedPairs, check_self_index
from .loss_output import call_backend


class SelfIndexForward:
    """Mixin (before PML's ``BaseMetricLossFunction``) adding a keyword-only ``self_index`` to
    ``forward``, passed on to ``compute_loss(..., self_index=...)``.

    ``loss(embeddings, labels, ref_emb=memory, ref_labels=memory_labels, self_index=slots)``
    ranks every query against all of ``memory`` but its own slot ``slots[i]``: the same lists as
    PML's ``indices_tuple`` of all (query, memory) pairs minus the self comparisons, without
    building that ``N x M`` index tuple (what :class:`~pml_rank_plugins.losses.CrossBatchMemory`
    calls). ``self_index=None`` (default) is PML's ``forward``, unchanged.
    """

    def forward(
        self,
        embeddings,
        labels=None,
        indices_tuple=None,
        ref_emb=None,
        ref_labels=None,
        *,
        self_index=None,
    ):
        """PML's ``BaseMetricLossFunction.forward``, plus ``self_index``.

        Args:
            embeddings: ``(N, D)`` query embeddings.
            labels: ``(N,)`` query labels.
            indices_tuple: PML pair / triplet tuple, or ``None``; exclusive with ``self_index``.
            ref_emb: ``(M, D)`` reference embeddings (``None``: the batch itself).
            ref_labels: ``(M,)`` reference labels.
            self_index: ``(N,)`` integer tensor: the column of ``ref_emb`` that holds query
                ``i`` itself (same label), left out of query ``i``'s list; needs ``ref_emb``.
                ``None``: no column left out (the batch's own diagonal still is when
                ``ref_emb`` is ``None``).

        Returns:
            The reduced loss.

        Raises:
            ValueError: ``self_index`` without ``ref_emb`` / ``ref_labels`` / ``labels``, with an
                ``indices_tuple``, or malformed
                (``pml_rank_plugins.utils.loss_and_miner_utils.check_self_index``).
        """
        check_labels(labels, "labels")  # before PML's own checks, which assume tensors
        check_labels(ref_labels, "ref_labels")
        check_ref_labels_pairing(ref_emb, ref_labels)  # PML would drop ref_labels silently
        # Where values are not read back (gpu / triton without check_values), indices that could
        # reach an indexing kernel out of range are clamped on the device and the loss is made
        # NaN instead (a device-side assert would kill the process): see clamp_indices_tuple.
        check_values = self._checks_values(embeddings)
        bad = None
        if not check_values:
            indices_tuple, bad = _safe_indices_tuple(indices_tuple, embeddings, ref_emb)
        if self_index is None:
            loss = super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
            return flag_non_finite(loss, bad)
        if ref_emb is None or ref_labels is None or labels is None:
            raise ValueError(
                "self_index names columns of ref_emb: pass labels, ref_emb and ref_labels with it "
                "(the batch against itself already leaves out its diagonal)"
            )
        # The body of PML 2.9's BaseMetricLossFunction.forward, with self_index passed on
        # (PML's forward takes no extra arguments); tests compare it with PML's path, reducers
        # and regularizers included.
        self.reset_stats()
        c_f.check_shapes(embeddings, labels)
        labels = c_f.to_device(labels, embeddings)
        ref_emb, ref_labels = c_f.set_ref_emb(embeddings, labels, ref_emb, ref_labels)
        # The entries' range and labels are read back only where the backend checks values
        # (the cpu backend, or check_values=True on the loss): see backend.checks_values.
        self_index = check_self_index(
            self_index, labels, ref_labels, indices_tuple, check_values=check_values
        )
        if not check_values:
            self_index, bad = clamp_self_index(self_index, labels, ref_labels)
        loss_dict = self.compute_loss(
            embeddings, labels, None, ref_emb, ref_labels, self_index=self_index
        )
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return flag_non_finite(self.reducer(loss_dict, embeddings, labels), bad)

    def _checks_values(self, embeddings) -> bool:
        """Whether this call reads input values back (``backend.checks_values`` for the backend
        the embeddings' device and dtype resolve to; ``True`` for a non-tensor, which PML's own
        checks refuse)."""
        if not isinstance(embeddings, torch.Tensor):
            return True
        backend = call_backend(embeddings.device, getattr(self, "backend", None), embeddings.dtype)
        return checks_values(backend, getattr(self, "check_values", None))


def _safe_indices_tuple(indices_tuple, embeddings, ref_emb):
    """:func:`~pml_rank_plugins.functional.validation.clamp_indices_tuple` against the rows of
    ``embeddings`` and ``ref_emb`` (the batch itself when ``None``), a miner's ``.weights`` kept;
    ``(indices_tuple, None)`` when there is none, or the rows are not 2-D tensors (refused by the
    shape checks later, with their own message)."""
    refs = embeddings if ref_emb is None else ref_emb
    if indices_tuple is None or not all(
        isinstance(x, torch.Tensor) and x.ndim == 2 for x in (embeddings, refs)
    ):
        return indices_tuple, None
    weights = getattr(indices_tuple, "weights", None)
    if weights is not None and len(indices_tuple) != 4:
        return indices_tuple, None  # refused by pair_weights: weights only come with pairs
    safe, bad = clamp_indices_tuple(indices_tuple, len(embeddings), len(refs))
    if weights is not None:
        safe = WeightedPairs(*safe, weights=weights)
    return safe, bad
