"""A fused Triton kernel for the Ranked List Loss (Wang et al., CVPR 2019; the ``triton``
backend of :class:`~pml_rank_plugins.losses.RankedListLoss`).

The same loss and gradients as :func:`~pml_rank_plugins.functional.ranked_list.gpu.
gpu_ranked_list_terms` (eqs. 8-14 with constant pair weights: each query's loss is linear in
its mined distances) for ``d_ij = sqrt(max(0, (|q_i|^2 - 2 q_i.r_j) + |r_j|^2))``, with no
``N x M`` buffer (FlashAttention-style: tiles of ``S = Q R^T`` are recomputed, never stored):

* Forward (:func:`~.triton_jit.stats_kernel`): a program owns ``block_n`` query rows and a
  contiguous range (a *split*) of reference columns; per ``(block_n, block_m)`` tile it computes
  ``S`` with ``tl.dot``, the distances, the candidates (labels, each row's own column or the
  diagonal ignored, or a miner's dense int8 categories) and RLL's non-trivial pairs
  (``d > alpha - m``, ``d < alpha``), and accumulates per row ``Z+ = sum w+``, ``S+ = sum w+ d``,
  ``Z-``, ``S-`` and the mined counts. The ``Tn`` weights ``exp(Tn (min - d))`` (eq. 9) need the
  row minimum over the mined negatives: an online softmax keeps the running minimum and rescales
  the sums when it drops (``exp(Tn (new - old))``), as FlashAttention does with its running
  maximum; likewise ``Tp`` (running maximum) and a miner's weights (running maximum weight, the
  reference scales each row's largest to 1). With a miner's weights under
  ``query_weighting="weight_share"`` the ``Tn`` minimum and sum are tracked as well (``W_i``
  always uses ``Tn``). Each split writes its own ``(10, N)`` statistics
  (:data:`~.triton_jit.NUM_STATS`); :func:`merge_splits` joins them in torch in a fixed order
  (rescaled to the common extreme): no atomics, deterministic. Then
  ``L_P = S+/Z+ - (alpha - m)``, ``L_N = alpha - S-/Z-`` (eqs. 11, 12), ``L = lam_pos L_P +
  lam L_N``; under ``"weight_share"`` ``log W_i = Tp (max - (alpha - m)) + log Z+`` joined with
  ``Tn (alpha - min) + log Z-`` (float64 log-add-exp: no overflow) gives the constant ``N c_i``.
* Backward (:func:`~.triton_jit.grad_queries_kernel`, :func:`~.triton_jit.grad_refs_kernel`):
  with ``g`` the upstream gradient, ``C_ij = g_i (lam_pos w+_ij / Z+_i - lam w-_ij / Z-_i) /
  d_ij`` (0 at ``d = 0``) is recomputed per tile from four ``(N,)`` rows (the two scaled
  inverses and the forward's extremes), and ``grad_Q = Q * rowsum(C) - C R`` by programs over
  (query rows, embedding columns, column split), ``grad_R = R * colsum(C) - C^T Q`` (only when
  the references need gradient) by programs over (reference rows, embedding columns, row split);
  each writes only its own rows, splits summed by ``torch.sum``: deterministic, no atomics.

Cost: forward one ``N M d`` product plus ``O(N M)`` elementwise work in registers; backward one
recomputation and one product per gradient: three ``N M d`` products in all with the default
``gallery_gradient=False`` (``grad_Q`` only; the floor ``S = X X^T`` forward + backward has
three too), five with reference gradient. Extra memory ``O(splits N + splits (N + M) d)`` floats, independent of ``N M``
(a miner's pairs come as ``N M`` int8 categories, and its weights as an ``(N, M)`` float32
matrix: the only ``N x M`` inputs). float32 (half inputs upcast, gradients returned in their
dtype); float64 is refused with a ``TypeError`` (use the ``cpu`` or ``gpu`` backend).

Precision: ``tl.dot`` with ``input_precision="tf32x3"`` (float32 accuracy on tensor cores), as
the histogram kernel (:mod:`pml_rank_plugins.functional.histogram.triton_kernel`). Under the
interpreter the products are numpy float32 ones.

Not yet timed on a GPU: :class:`Tiles` (shared with the histogram kernel, as are the launch
sizing and the score tile: :mod:`pml_rank_plugins.functional.triton_tiles`) has the histogram
kernel's defaults. Compiled ahead of time for sm_90a here (triton 3.8's ptxas, no GPU), 64 x 64
tiles, 4 warps: 255 registers each; spills of 0 bytes (forward, labels), 3,776 (forward, a
miner's categories and weights), 1,140 (``grad_Q``) and 788 (``grad_R``), against 632 / 796
for the histogram kernel's forward / ``grad_Q``; with 8 warps 0, -, 208 and 196
(``block_d=64``: 52 and 100).
A GPU session should sweep ``num_warps`` and ``block_d`` (``Tiles``).

Compile-ready: the kernel is two ``torch.library`` custom operators, ``pml_rank::ranked_list``
(forward; autograd registered, backward calls the second) and ``pml_rank::ranked_list_grad``,
each with a fake (meta) implementation, so ``torch.compile(fullgraph=True)`` traces through
them (custom operators are opaque to Inductor: it does not fuse into the kernels, and needs
not). ``torch.library.triton_op`` would let Inductor see the kernels, but a compile traces a
``triton_op``'s body with fake tensors, which Triton's interpreter cannot launch on (triton 3.8,
torch 2.14: a fullgraph ``aot_eager`` compile of a toy ``triton_op`` fails with "Cannot access
data pointer of Tensor (e.g. FakeTensor ...)"), so the CPU tests could not compile it.

Triton is optional: without it this module imports, and :func:`triton_ranked_list_terms`
raises ``RuntimeError``. On CPU the kernels run only in Triton's interpreter:
``TRITON_INTERPRET=1`` must be set before :mod:`.triton_jit` is first imported.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..sync_free_inputs import autocast_off
from ..triton_tiles import DEFAULT_TILES, Tiles
from . import triton_jit
from .gpu_steps import DensePairs, DenseWeights, LabelPairs, query_scales
from .params import check_embedding_pair, check_loss_finite, check_loss_range, checked_params
from .reference import RankedListTerms
from .triton_jit import triton
from .triton_ops import merge_splits, ranked_list_grad_op, ranked_list_op

_PRECISIONS = ("tf32x3", "ieee", "tf32")


def interpreted() -> bool:
    """Whether the kernels were defined in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton is not None and type(triton_jit.stats_kernel).__name__ == "InterpretedFunction"


def triton_available_for(device: Union[torch.device, str]) -> bool:
    """Whether the kernel can run on ``device``: triton imports and the device is CUDA, or the
    kernels run in the interpreter (then CPU tensors). O(1)."""
    if triton is None:
        return False
    kind = torch.device(device).type
    return kind == "cpu" if interpreted() else kind == "cuda"


def log_weight_sums_from_stats(stats: torch.Tensor, params, given: bool) -> torch.Tensor:
    """``log W_i`` (float64) from the row statistics: ``W+ = exp(Tp (max - (alpha - m))) Z+``
    and ``W- = exp(Tn (alpha - min)) Z-`` (the ``Tn`` sums also with a miner's weights), joined
    by a log-add-exp (the values of ``query_weighting.log_weight_sums``); ``-inf`` where nothing
    is mined. O(N)."""
    stats = stats.double()

    def log_sum(ext, z, offset):
        value = z.log() if offset is None else z.log() + offset(ext)
        return torch.where(z > 0, value, float("-inf"))

    thr = params.alpha - params.margin
    pos = log_sum(stats[0], stats[1], None if params.Tp == 0.0 else lambda e: (e - thr) * params.Tp)
    tn = None if params.Tn == 0.0 else lambda e: (params.alpha - e) * params.Tn
    if not given:
        neg = log_sum(stats[4], stats[5], tn)
    else:
        neg = log_sum(stats[8], stats[9] if tn is not None else stats[7], tn)
    return torch.logaddexp(pos, neg)


def _pair_tensors(pairs, n: int, m: int, device: torch.device):
    """``(labels, ref_labels, self_columns, categories, diagonal)`` of a pair source."""
    if isinstance(pairs, DensePairs):
        cats = pairs.categories
        if cats.dtype != torch.int8 or tuple(cats.shape) != (n, m) or cats.device != device:
            raise ValueError(
                f"DensePairs.categories must be ({n}, {m}) int8 on {device}, got "
                f"{tuple(cats.shape)} {cats.dtype} on {cats.device}"
            )
        return None, None, None, cats.contiguous(), False
    if not isinstance(pairs, LabelPairs):
        raise TypeError(f"pairs must be a LabelPairs or DensePairs, got {type(pairs).__name__}")
    labels, ref_labels = pairs.labels.reshape(-1), pairs.ref_labels.reshape(-1)
    if len(labels) != n or len(ref_labels) != m:
        raise ValueError(f"labels for ({n}, {m}) pairs, got {len(labels)}, {len(ref_labels)}")
    own = None if pairs.self_columns is None else pairs.self_columns.reshape(-1).contiguous()
    return labels.contiguous(), ref_labels.contiguous(), own, None, bool(pairs.diagonal)


def _check_runnable(device: torch.device) -> None:
    """``RuntimeError`` unless the kernels can run on ``device`` (:func:`triton_available_for`)."""
    if triton is None:
        raise RuntimeError(
            "the triton Ranked List kernel needs the triton package, which cannot be imported"
        )
    if not triton_available_for(device):
        raise RuntimeError(
            "the triton Ranked List kernel runs on CUDA tensors (or on CPU tensors in Triton's "
            "interpreter: TRITON_INTERPRET=1 set before this module is imported); got "
            f"{device}" + (" with the interpreter on" if interpreted() else "")
        )


def _checked_embeddings(queries: torch.Tensor, refs: torch.Tensor):
    check_embedding_pair(queries, refs)
    if queries.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            f"the embeddings are {queries.dtype}; the triton Ranked List kernel computes in "
            "float32 and takes float32, float16 or bfloat16 (use the cpu or gpu backend for "
            "float64)"
        )
    if queries.device != refs.device:
        raise ValueError(f"queries are on {queries.device}, refs on {refs.device}")
    # Upcasting is differentiable: half inputs get their gradients back in their own dtype.
    return queries.float(), refs.float()


def triton_ranked_list_terms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    pairs: Union[LabelPairs, DensePairs],
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    Tp: float = 0.0,
    lam: float = 1.0,
    neg_weights: Optional[DenseWeights] = None,
    lam_pos: float = 1.0,
    query_weighting: str = "mean",
    check_values: bool = False,
    tiles: Tiles = DEFAULT_TILES,
) -> RankedListTerms:
    """Per-query Ranked List Loss of ``queries`` against ``refs`` (Euclidean) by the fused kernel.

    Args and returns as :func:`~pml_rank_plugins.functional.ranked_list.gpu.
    gpu_ranked_list_terms` (the same values and gradients to float32 rounding), except:
    ``queries`` / ``refs`` float32, float16 or bfloat16 (computed in float32; float64 is a
    ``TypeError``); no ``chunk_size`` (the kernel tiles internally: ``tiles``, a :class:`Tiles`).
    ``refs`` may be ``queries`` (gradient through both ends of every pair) or
    ``queries.detach()`` (the query side only: one gradient kernel fewer). ``pairs``: a
    :class:`~.gpu_steps.LabelPairs` (labels, each query's own column or the diagonal ignored) or a
    :class:`~.gpu_steps.DensePairs` (a miner's ``(N, M)`` int8 categories); ``neg_weights``: a
    :class:`~.gpu_steps.DenseWeights`, written once into an ``(N, M)`` float32 matrix.

    Reads no tensor value on the host unless ``check_values`` (a finite loss). Raises
    ``RuntimeError`` where triton cannot run on the device (:func:`triton_available_for`),
    ``TypeError`` / ``ValueError`` for malformed inputs. Time three ``N M d`` products (module
    docstring); memory ``O(splits (N + M) d)``.
    """
    params = checked_params(alpha, margin, Tn, Tp, lam, lam_pos, query_weighting=query_weighting)
    queries, refs = _checked_embeddings(queries, refs)
    check_loss_range(torch.float32, alpha, lam, lam_pos)
    if tiles.precision not in _PRECISIONS:
        raise ValueError(f"tiles.precision must be one of {_PRECISIONS}, got {tiles.precision!r}")
    n, m = len(queries), len(refs)
    labels, ref_labels, own, categories, diagonal = _pair_tensors(pairs, n, m, queries.device)
    _check_runnable(queries.device)  # after every input check: those name the argument
    weights = None
    if neg_weights is not None:
        weights = neg_weights.rows(0, n, m, torch.float32)
    with autocast_off(queries.device.type):
        loss, pos_loss, neg_loss, num_pos, num_neg, stats = ranked_list_op(
            queries, refs, labels, ref_labels, own, categories, weights, diagonal, params.alpha,
            params.margin, params.Tn, params.Tp, params.lam, params.lam_pos, params.share,
            *tiles.encode(),
        )  # fmt: skip
        if params.share:
            # A constant per query: autograd scales the upstream gradient g_i by it.
            scale = query_scales(log_weight_sums_from_stats(stats, params, weights is not None))
            loss = loss * scale.to(loss.dtype)
        if check_values:
            check_loss_finite(loss.detach(), params.alpha, params.lam)
    return RankedListTerms(loss, pos_loss, neg_loss, num_pos, num_neg)


__all__ = [
    "DEFAULT_TILES",
    "Tiles",
    "interpreted",
    "log_weight_sums_from_stats",
    "merge_splits",
    "ranked_list_grad_op",
    "ranked_list_op",
    "triton_available_for",
    "triton_ranked_list_terms",
]
