"""Ranked List Loss (Wang et al., CVPR 2019) as a PML loss."""

from __future__ import annotations

from functools import partial

import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.utils import common_functions as c_f

from ..functional.backend import check_backend_options, checks_values
from ..functional.chunk_threads import glue_elements, one_thread_apply, one_torch_thread
from ..functional.ranked_list import (
    check_query_weighting,
    check_rll_params,
    default_alpha,
    ranked_list_terms,
    term_weights,
)
from ..functional.ranked_list.cpu import SparseWeights, chunked_ranked_list_terms
from ..functional.screened_inputs import normalize_rows_screened, prepare_embeddings_screened
from ..functional.sync_free_inputs import autocast_off
from ..functional.validation import validate_indices_tuple
from ..utils.gpu_inputs import pair_weights
from ..utils.loss_and_miner_utils import (
    check_chunk_size,
    check_loss_labels,
    distance_matrix,
    euclidean_embeddings,
    pair_masks,
    ranked_list_categories,
)
from ..utils.ranked_list_backends import sync_free_loss_terms
from .loss_output import call_backend, finish_loss
from .self_index import SelfIndexForward

# The cpu path's normalization: normalize_rows' values in fewer passes, on one torch thread
# (forward and backward, as loss_and_miner_utils.euclidean_embeddings does).
SCREENED_NORMALIZE = partial(one_thread_apply, normalize_rows_screened)


class RankedListLoss(SelfIndexForward, BaseMetricLossFunction):
    """Ranked List Loss: per query, ``L = L_P + lam L_N`` (eq. 13), mean over queries (eq. 14).

    Per query ``i`` and reference item ``j`` at distance ``d`` (default ``LpDistance``: Euclidean
    distance of L2-normalized embeddings): mined positives ``d > alpha - margin`` contribute
    ``d - (alpha - margin)`` averaged (eq. 11; weighted by ``exp(Tp (d - alpha + margin))`` when
    ``Tp > 0``, as in the journal version); mined negatives ``d < alpha`` contribute
    ``alpha - d`` weighted by ``exp(Tn (alpha - d))``, normalized (eqs. 9, 12). See
    :func:`~pml_rank_plugins.functional.ranked_list_terms`.

    Drop-in for PML's ``RankedListLoss(margin, Tn, imbalance=0.5, alpha=None, Tp=0)``: same
    positional order and keywords, same meaning (``RankedListLoss(0.4, 10)`` is ``margin=0.4,
    Tn=10``). Differences (:doc:`/ranked-list`, :doc:`/migrating`): the weights are constants (no
    gradient through them, as in the authors' code), so every mined negative is pushed away at any
    ``Tn``; weights are a masked softmax (no overflow, no epsilon); without ``imbalance`` the loss
    is the paper's ``L_P + lam L_N`` (PML's default ``imbalance=0.5`` is ``0.5 *`` ours with
    ``lam=1``); ``ref_emb`` and ``indices_tuple`` are supported. With a memory bank use
    :class:`pml_rank_plugins.losses.CrossBatchMemory`: PML's own refuses this class by name
    ("CrossBatchMemory not supported for RankedListLoss"); likewise
    :class:`pml_rank_plugins.losses.SelfSupervisedLoss` instead of PML's.

    Args:
        margin: positives are pulled within ``alpha - margin`` (>= 0, < ``alpha``).
        Tn: negative temperature (>= 0; eq. 9).
        imbalance: PML's parametrization ``(1 - imbalance) L_P + imbalance L_N``, ``b`` in
            ``[0, 1]``; equals ``(1 - b) *`` the loss with ``lam = b / (1 - b)`` (same
            minimizer, gradients scaled by ``1 - b``). ``None`` (default): the paper's
            ``L_P + lam L_N``. Mutually exclusive with ``lam``.
        alpha: negatives are pushed beyond ``alpha`` (> ``margin``); ``None`` (default):
            ``1 + margin / 2`` as in PML (1.2 for the paper's ``margin=0.4``).
        Tp: positive temperature (>= 0; journal version; 0 = plain mean).
        lam: weight of ``L_N`` in eq. 13 (>= 0); ``None``: 1. Keyword-only.
        gallery_gradient: ``False`` (paper sec. 3.2, "we regard the features of other examples as
            constants"): in query ``i``'s list only ``x_i`` receives gradient, i.e. distances are
            taken to ``ref_emb.detach()``. When ``ref_emb`` is the batch, every embedding still
            gets gradient as the query of its own list. ``True``: gradient reaches both ends of
            every pair.
        query_weighting: how the queries of a batch are weighted. ``"mean"`` (default): the
            paper's eq. 14, ``L = (1/N) sum_i L_i``. ``"weight_share"``: the authors' released
            Caffe layer (``DistanceWeightedValidPairLossV12``,
            ``CaffeMex_RLL_GR_V03_Simp/src/caffe/layers/distance_weighted_valid_pair_loss_V12_``
            ``layer.cpp`` in github.com/XinshaoAmosWang/Ranked-List-Loss-for-DML),
            ``L = sum_i c_i L_i`` with ``c_i = 0.5 W_i / sum_k W_k`` and
            ``W_i = sum_{mined pos} exp(Tp (d - (alpha - margin))) + sum_{mined neg}
            exp(Tn (alpha - d))``, query ``i``'s unnormalized pair weights: queries with many or
            hard violating pairs count more, and the weights sum to 0.5 (so on a batch where
            every ``W_i`` is equal the loss and its gradient are half the paper's). Within a
            query both are eqs. 8-12 (the Caffe layer normalizes each sign by its own weight sum
            and adds them with weight 1). ``c_i`` is a constant, like the pair weights, and is
            always computed from ``Tn`` / ``Tp``, also when a miner's ``.weights`` replace the
            within-query negative weights. Element losses are ``N c_i L_i``, so PML's default
            ``MeanReducer`` gives ``sum_i c_i L_i`` (another reducer averages those instead).
            Any other value: ``ValueError``. Keyword-only.
        backend: ``None`` (default: the ``use_backend`` context, else ``$PML_RANK_BACKEND``,
            else ``auto``), ``"auto"``, ``"cpu"``, ``"gpu"`` or ``"triton"``
            (``pml_rank_plugins.functional.backend``). ``cpu``: the chunked kernel above
            (sparse mined pairs, CPU-cache chunks). ``gpu``: dense chunks from a fixed memory
            budget, no host synchronisation in forward or backward
            (``pml_rank_plugins.functional.ranked_list.gpu``; same values and gradients to
            rounding); ``triton``: the fused kernel
            (``pml_rank_plugins.functional.ranked_list.triton_kernel``: no ``N x M`` buffer,
            every option of this class; float64 embeddings a ``TypeError``; any other distance
            object than the default runs the ``gpu`` dense path). Keyword-only.
        check_values: read input values back to validate them (finite embeddings, index ranges
            of ``indices_tuple``, miner weights, a finite loss): ``None`` (default) does so on
            ``cpu`` only; on ``gpu`` / ``triton`` each check would synchronise the host, so they
            are opt-in (``True``) there (the trainers check the loss once per step). Shape, dtype
            and device checks always run. Keyword-only.

    ``self_index`` (keyword of ``forward``): the column of ``ref_emb`` holding each query itself,
    left out of its list (:class:`~pml_rank_plugins.losses.self_index.SelfIndexForward`; what
    :class:`~pml_rank_plugins.losses.CrossBatchMemory` passes instead of an ``indices_tuple``).

    ``indices_tuple``: from any PML miner (pairs or triplets); each query's list is restricted to
    its mined pairs, then to RLL's non-trivial ones. If it carries ``.weights`` aligned with the
    negative pairs ``(a2, n)`` (as :class:`pml_rank_plugins.miners.RankedListMiner` output does),
    those weights replace the ``Tn`` weights (renormalized per query).

    Output: ``"element"`` losses, one per query (all ``N``; a query with nothing mined has loss 0,
    as in eq. 14's mean over all queries). PML's default ``MeanReducer`` gives eq. 14;
    ``AvgNonZeroReducer`` averages over queries with something mined instead.

    Stats (``collect_stats``): ``num_pos_pairs``, ``num_neg_pairs`` (mined, total),
    ``avg_pos_per_query``, ``avg_neg_per_query``, ``num_queries_nothing_mined``,
    ``num_valid_queries`` (queries in the mean: all ``N``) and ``num_skipped_queries`` (0). On the
    ``gpu`` / ``triton`` backends the first five are 0-dim tensors on the embeddings' device
    (Python numbers would need a host read each); ``.item()`` them when logging.

    An empty batch or an empty ``ref_emb`` gives a zero loss connected to the graph (backward
    works, zero gradient) with every query counted in ``num_skipped_queries`` and
    ``num_valid_queries = 0`` (the policy of every loss in this package).

    float16/bfloat16 embeddings, and any input under ``torch.autocast``, are computed in
    float32 (reduced too), and the loss is returned in float32 under ``torch.autocast`` and in
    the embeddings' dtype outside it, as PML's losses return it (a float32 value above 65504 becomes ``inf`` in float16). ``alpha`` or ``lam`` so
    large that the loss overflows the compute dtype raise ``ValueError`` naming them; any finite
    ``Tn``/``Tp`` works.

    float16 gradient range: the gradient is computed in float32 and cast back to the embeddings'
    dtype, so with float16 embeddings (e.g. the output of a float16 layer under autocast) an
    entry above float16's largest value, 65504, becomes ``inf`` (never NaN): the overflow signal
    ``torch.amp.GradScaler`` handles by skipping the step and lowering its scale. (The loss value
    is rounded to float16 after the float32 computation and reduction, and that rounding does not
    enter the gradient: a value above 65504, e.g. at ``lam = 1e10``, is ``inf`` while the
    gradient is the float32 one, cast.) An entry is at most about ``(lam_pos + lam) / (N ||x||)``
    (default mean reduction over ``N`` queries, ``gallery_gradient=False``, ``||x||`` the raw row
    norm; the mined weights of a list sum to 1 and a unit-normalized distance moves by at most
    ``1 / ||x||``), times a GradScaler's scale. Measured at ``N = 32``, ``||x|| ~ 1``: largest
    entry ``0.038 lam``, float16 gradients finite up to ``lam = 1.5e6``, inf from ``lam = 2e6``
    (the audit's ``lam = 1e10``: inf). Computing in float32 already happens; the value itself is
    out of float16's range, so no exact guard exists. bfloat16 and float32 do not overflow at any
    accepted ``lam``.

    Cost: with PML's default ``LpDistance(p=2, power=1)`` (normalized or not) the loss runs the
    chunked kernel ``pml_rank_plugins.functional.ranked_list.cpu``: O(N M d) time, memory
    O(threads x chunk_size x M) floats (one chunk buffer per CPU thread) + O(number of mined
    pairs), no float N x M tensor (plus N M bytes
    of pair categories with an ``indices_tuple``). ``chunk_size``: query rows per chunk
    (``None``: 256K pairs or 128 rows, whichever is more, at most 4M pairs). Any other distance
    object (subclasses included) is called as is and the dense kernel
    :func:`pml_rank_plugins.functional.ranked_list_terms` runs on its ``(N, M)``
    matrix: O(N M) memory.
    """

    def __init__(
        self,
        margin: float = 0.4,
        Tn: float = 10.0,
        imbalance: float | None = None,
        alpha: float | None = None,
        Tp: float = 0.0,
        *,
        lam: float | None = None,
        gallery_gradient: bool = False,
        chunk_size: int | None = None,
        query_weighting: str = "mean",
        backend: str | None = None,
        check_values: bool | None = None,
        **kwargs,
    ):
        alpha = default_alpha(margin, alpha)
        lam_pos, lam = term_weights(imbalance, lam)
        check_rll_params(alpha, margin, Tn, Tp, lam, lam_pos)
        query_weighting = check_query_weighting(query_weighting)
        chunk_size = check_chunk_size(chunk_size)
        backend, check_values = check_backend_options(backend, check_values)
        super().__init__(**kwargs)
        self.chunk_size, self.query_weighting = chunk_size, query_weighting
        self.backend, self.check_values = backend, check_values
        if self.distance.is_inverted:
            raise ValueError("RankedListLoss needs a distance (small = similar), not a similarity")
        self.margin, self.alpha = float(margin), float(alpha)
        self.Tn, self.Tp, self.lam, self.lam_pos = float(Tn), float(Tp), float(lam), float(lam_pos)
        self.imbalance = None if imbalance is None else float(imbalance)
        self.gallery_gradient = bool(gallery_gradient)
        self.add_to_recordable_attributes(
            list_of_names=["margin", "alpha", "Tn", "Tp", "lam", "lam_pos"], is_stat=False
        )
        self.add_to_recordable_attributes(
            list_of_names=[
                "num_pos_pairs",
                "num_neg_pairs",
                "avg_pos_per_query",
                "avg_neg_per_query",
                "num_queries_nothing_mined",
                "num_valid_queries",
                "num_skipped_queries",
            ],
            is_stat=True,
        )

    def get_default_distance(self):
        return LpDistance(p=2, power=1, normalize_embeddings=True)

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
        """PML's ``forward`` (plus ``self_index``, see
        :class:`~pml_rank_plugins.losses.self_index.SelfIndexForward`). Computed and reduced in
        float32 for float16/bfloat16 embeddings; returned in float32 under ``torch.autocast``
        (as PML's losses), else in the embeddings' dtype (``loss_output.loss_dtype``)."""
        loss = super().forward(
            embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index=self_index
        )
        return finish_loss(loss, embeddings, self)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index=None):
        check_loss_labels(labels, ref_labels)
        # Under torch.autocast the distance product would run in bfloat16/float16 (and its
        # backward mix dtypes): everything here is computed in float32 or better instead.
        # The glue around the kernel on one torch thread too (chunk_threads.one_torch_thread).
        device = embeddings.device
        glue = glue_elements(embeddings, ref_emb, dense_pairs=indices_tuple is not None)
        backend = call_backend(device, self.backend, embeddings.dtype)
        if backend != "cpu":
            values = checks_values(backend, self.check_values)
            # (one_torch_thread is a no-op while torch.compile traces: see chunk_threads.)
            with autocast_off(device.type), one_torch_thread(device, glue):
                terms = sync_free_loss_terms(
                    self,
                    embeddings,
                    labels,
                    indices_tuple,
                    ref_emb,
                    ref_labels,
                    self_index,
                    values,
                    backend=backend,
                )
                return self._loss_dict(terms, False)
        with torch.autocast(device.type, enabled=False), one_torch_thread(device, glue):
            return self._compute_loss(
                embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index
            )

    def _compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, self_index):
        # The checks and normalization of validation.py, screened: a memory bank's references
        # are ~12 passes cheaper per call, same values and errors (functional/screened_inputs).
        emb, ref, is_self = prepare_embeddings_screened(embeddings, ref_emb)
        # Before anything indexes with them: a negative index would silently wrap around.
        validate_indices_tuple(indices_tuple, len(emb), len(ref))
        if len(emb) == 0 or len(ref) == 0:
            # Nothing to rank: a zero loss connected to the graph, every query skipped.
            self.num_valid_queries, self.num_skipped_queries = 0, len(emb)
            return self._loss_dict(None, True)
        self.num_valid_queries, self.num_skipped_queries = len(emb), 0
        neg_weights = self._pair_weights(indices_tuple, emb.device)
        chunkable = euclidean_embeddings(
            self.distance, emb, ref, is_self, self.gallery_gradient, SCREENED_NORMALIZE
        )
        if chunkable is not None:
            queries, refs = chunkable
            with torch.no_grad():
                categories = ranked_list_categories(
                    labels, ref_labels, indices_tuple, is_self, self_index
                )
            terms = chunked_ranked_list_terms(
                queries,
                refs,
                categories,
                **self._params(),
                neg_weights=None if neg_weights is None else SparseWeights(*neg_weights),
                chunk_size=self.chunk_size,
            )
        else:  # any other distance object: its (N, M) matrix, then the dense kernel
            dist = distance_matrix(self.distance, emb, ref, self.gallery_gradient)
            with torch.no_grad():
                pos_mask, neg_mask = pair_masks(
                    labels, ref_labels, indices_tuple, exclude_self=is_self, self_index=self_index
                )
                dense_weights = None
                if neg_weights is not None:
                    dense_weights = torch.zeros_like(dist)
                    dense_weights[neg_weights[0], neg_weights[1]] = neg_weights[2].to(dist.dtype)
            terms = ranked_list_terms(
                dist, pos_mask, neg_mask, **self._params(), neg_weights=dense_weights
            )
        return self._loss_dict(terms, True)

    def _loss_dict(self, terms, host_stats: bool) -> dict:
        """PML's loss dictionary of per-query losses; stats set first (``None``: empty batch)."""
        if terms is None:
            if self.collect_stats:
                self._set_empty_stats()
            return self.zero_losses()
        if self.collect_stats and host_stats:
            self._set_stats(terms)
        elif self.collect_stats:
            self._set_device_stats(terms)
        return {
            "loss": {
                "losses": terms.loss,
                "indices": c_f.torch_arange_from_size(terms.loss),
                "reduction_type": "element",
            }
        }

    def _params(self) -> dict:
        return dict(
            alpha=self.alpha,
            margin=self.margin,
            Tn=self.Tn,
            Tp=self.Tp,
            lam=self.lam,
            lam_pos=self.lam_pos,
            query_weighting=self.query_weighting,
        )

    @staticmethod
    def _pair_weights(indices_tuple, device):
        """``(a2, n, weights)`` from ``indices_tuple.weights`` (checked, values included: the
        cpu path; ``utils.gpu_inputs.pair_weights``), or ``None``."""
        weights = pair_weights(indices_tuple, device, check_values=True)
        return None if weights is None else (weights.anchors, weights.refs, weights.weights)

    def _set_empty_stats(self):
        self.num_pos_pairs = self.num_neg_pairs = 0
        self.avg_pos_per_query = self.avg_neg_per_query = 0.0
        self.num_queries_nothing_mined = self.num_skipped_queries

    def _set_stats(self, terms):
        num_pos, num_neg = terms.num_pos, terms.num_neg
        self.num_pos_pairs = int(num_pos.sum().item())
        self.num_neg_pairs = int(num_neg.sum().item())
        self.avg_pos_per_query = num_pos.double().mean().item()
        self.avg_neg_per_query = num_neg.double().mean().item()
        self.num_queries_nothing_mined = int(((num_pos == 0) & (num_neg == 0)).sum().item())

    def _set_device_stats(self, terms):
        """The ``gpu`` / ``triton`` stats: 0-dim tensors on the device (no host read)."""
        num_pos, num_neg = terms.num_pos, terms.num_neg
        self.num_pos_pairs, self.num_neg_pairs = num_pos.sum(), num_neg.sum()
        self.avg_pos_per_query = num_pos.double().mean()
        self.avg_neg_per_query = num_neg.double().mean()
        self.num_queries_nothing_mined = ((num_pos == 0) & (num_neg == 0)).sum()
