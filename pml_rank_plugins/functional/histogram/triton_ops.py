"""The fused Triton histogram kernels as ``torch.library`` custom ops (namespace ``pml_rank``).

Two operators, each with a fake (meta) implementation for tracing, and the autograd formula that
joins them:

* ``pml_rank::triton_pair_histograms(queries, refs, labels?, ref_labels?, self_columns?,
  categories?, offset, scale, num_intervals, tiles, precision) -> Tensor``: the ``(N, 2, L + 1)``
  float32 histograms (the forward kernel of :mod:`.triton_jit`);
* ``pml_rank::triton_pair_histograms_backward(slope, queries, refs, ..., of_queries) ->
  Tensor``: ``dS R`` (``(N, d)``, ``of_queries``) or ``dS^T Q`` (``(M, d)``), the two gradient
  kernels, from the slope table ``scale (g[.., b + 1] - g[.., b])`` that the autograd formula
  builds with torch operators.

Why custom ops: ``torch.compile`` then treats each kernel launch as one opaque operator whose
output shape comes from the fake implementation. Without them dynamo traced into the
``autograd.Function`` and its Python launch code (grid arithmetic, ``triton.cdiv``, a
``torch.cuda.device`` context) and inductor had to compile the user kernels itself, which crashed
(``InductorError`` on an H200, issue 48). ``custom_op`` rather than ``triton_op``: an opaque
operator is what Triton's CPU interpreter can run under ``torch.compile`` too (the interpreted
kernels are not ``triton.jit`` functions, which ``wrap_triton`` requires), so the compiled path is
tested on CPU exactly as it runs on a GPU.

Eager calls skip the dispatcher: :func:`pair_histograms` runs the same launches through
:class:`EagerPairHistograms` (an ``autograd.Function``) unless ``torch.compile`` is tracing, where
it calls the op; the custom-op dispatch would add host time per call (measured in
:class:`EagerPairHistograms`).

Optional tensors: ``labels`` / ``ref_labels`` / ``self_columns`` are ``None`` when dense
``categories`` are given, and ``categories`` is ``None`` with labels (schema ``Tensor?``).
``tiles`` and ``precision`` are :class:`~pml_rank_plugins.functional.triton_tiles.Tiles` as
:meth:`~pml_rank_plugins.functional.triton_tiles.Tiles.encode` writes them (eight integers,
``target_programs`` ``-1`` for ``None``, and the precision string). Inputs are validated by the
caller, :func:`~.triton_kernel.triton_pair_histograms`; the operators expect float32 embeddings
on a device the kernels run on. Time and memory: see :mod:`.triton_kernel`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..triton_tiles import Tiles
from .triton_launch import Launch, forward_histograms, gradient

_Tensor = torch.Tensor


def _launch(queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
            num_intervals, tiles, precision) -> Launch:  # fmt: skip
    """The kernels' shared arguments; the index vectors are read as contiguous arrays."""

    def flat(index):
        return None if index is None else index.contiguous()

    return Launch(queries, refs, flat(labels), flat(ref_labels), flat(self_columns), categories,
                  offset, scale, num_intervals, Tiles.decode(tiles, precision))  # fmt: skip


# Explicit schemas: ``int`` (not the inferred ``SymInt``) for the bin count and the tiles, which
# become ``tl.constexpr`` launch arguments and must stay concrete under dynamic shapes.
_INPUTS = ("Tensor queries, Tensor refs, Tensor? labels, Tensor? ref_labels, Tensor? self_columns, "
           "Tensor? categories, float offset, float scale, int num_intervals, int[] tiles, "
           "str precision")  # fmt: skip


@torch.library.custom_op(
    "pml_rank::triton_pair_histograms", mutates_args=(), schema=f"({_INPUTS}) -> Tensor"
)
def histograms_op(
    queries: _Tensor,
    refs: _Tensor,
    labels: Optional[_Tensor],
    ref_labels: Optional[_Tensor],
    self_columns: Optional[_Tensor],
    categories: Optional[_Tensor],
    offset: float,
    scale: float,
    num_intervals: int,
    tiles: list[int],
    precision: str,
) -> _Tensor:
    """``(N, 2, num_intervals + 1)`` float32 histograms (see the module docstring)."""
    launch = _launch(queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
                     num_intervals, tiles, precision)  # fmt: skip
    return _histograms(launch)


def _histograms(launch: Launch) -> torch.Tensor:
    n, m, _ = launch.sizes
    if min(n, m) == 0:
        return launch.pointers[0].new_zeros(n, 2, launch.flags["NUM_BINS"])
    return forward_histograms(launch)


@histograms_op.register_fake
def _histograms_fake(queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
                     num_intervals, tiles, precision):  # fmt: skip
    return queries.new_empty(queries.shape[0], 2, num_intervals + 1, dtype=torch.float32)


@torch.library.custom_op(
    "pml_rank::triton_pair_histograms_backward",
    mutates_args=(),
    schema=f"(Tensor slope, {_INPUTS}, bool of_queries) -> Tensor",
)
def gradient_op(
    slope: _Tensor,
    queries: _Tensor,
    refs: _Tensor,
    labels: Optional[_Tensor],
    ref_labels: Optional[_Tensor],
    self_columns: Optional[_Tensor],
    categories: Optional[_Tensor],
    offset: float,
    scale: float,
    num_intervals: int,
    tiles: list[int],
    precision: str,
    of_queries: bool,
) -> _Tensor:
    """``dS R`` (``(N, d)``, ``of_queries``) or ``dS^T Q`` (``(M, d)``), float32, from the
    ``(N, 2, L + 1)`` ``slope`` table (already times ``scale``; last column 0)."""
    launch = _launch(queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
                     num_intervals, tiles, precision)  # fmt: skip
    return _gradient(launch, slope, of_queries)


def _gradient(launch: Launch, slope: torch.Tensor, of_queries: bool) -> torch.Tensor:
    owned = launch.pointers[0 if of_queries else 1]
    if min(launch.sizes) == 0:  # no pair, or d = 0: nothing to launch
        return owned.new_zeros(owned.shape, dtype=torch.float32)
    return gradient(launch, slope.contiguous(), of_queries)


@gradient_op.register_fake
def _gradient_fake(slope, queries, refs, labels, ref_labels, self_columns, categories, offset,
                   scale, num_intervals, tiles, precision, of_queries):  # fmt: skip
    owned = queries if of_queries else refs
    return owned.new_empty(owned.shape[0], owned.shape[1], dtype=torch.float32)


def _setup_context(ctx, inputs, output) -> None:
    tensors, params = inputs[:6], inputs[6:]
    ctx.save_for_backward(*tensors)
    ctx.params = params


def _slope(grad_hist: torch.Tensor, scale: float) -> torch.Tensor:
    """``slope[i, c, b] = scale (g[i, c, b + 1] - g[i, c, b])``, 0 in the last column (a pair at
    or beyond the last centre is clamped): what the gradient kernels read."""
    grad_hist = grad_hist.to(torch.float32)
    return F.pad(grad_hist[..., 1:] - grad_hist[..., :-1], (0, 1)).mul_(float(scale))


def _backward(ctx, grad_hist):
    """Gradients of ``queries`` and ``refs`` by the backward op (``None`` for the rest)."""
    tensors = ctx.saved_tensors
    offset, scale, num_intervals, tiles, precision = ctx.params
    slope = _slope(grad_hist, scale)
    grads = [
        (
            gradient_op(slope, *tensors, offset, scale, num_intervals, tiles, precision, of_queries)
            if ctx.needs_input_grad[k]
            else None
        )
        for k, of_queries in ((0, True), (1, False))
    ]
    return (*grads, None, None, None, None, None, None, None, None, None)


histograms_op.register_autograd(_backward, setup_context=_setup_context)


class EagerPairHistograms(torch.autograd.Function):
    """The custom ops' forward and backward as one ``autograd.Function``, for eager calls: the
    same launches (same values, bit for bit) without the dispatcher, whose Python custom-op
    path costs host time where the loss is host-bound (measured on CPU, meta tensors, forward
    only: 42-48 us a call through ``histograms_op`` with autograd, 9 us through an equivalent
    ``autograd.Function``). The launch arguments are built once and reused by the backward.
    ``torch.compile`` never traces this class (:func:`pair_histograms` calls the op there)."""

    @staticmethod
    def forward(ctx, queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
                num_intervals, tiles, precision):  # fmt: skip
        launch = _launch(queries, refs, labels, ref_labels, self_columns, categories, offset,
                         scale, num_intervals, tiles, precision)  # fmt: skip
        ctx.launch, ctx.scale = launch, scale
        # The launch holds the tensors; saved too, so autograd checks they are not modified.
        ctx.save_for_backward(queries, refs)
        return _histograms(launch)

    @staticmethod
    def backward(ctx, grad_hist):
        slope = _slope(grad_hist, ctx.scale)
        grads = [
            _gradient(ctx.launch, slope, of_queries) if ctx.needs_input_grad[k] else None
            for k, of_queries in ((0, True), (1, False))
        ]
        return (*grads, None, None, None, None, None, None, None, None, None)


def pair_histograms(queries, refs, labels, ref_labels, self_columns, categories, offset: float,
                    scale: float, num_intervals: int, tiles: Tiles) -> torch.Tensor:  # fmt: skip
    """The histograms with ``tiles`` (a :class:`~pml_rank_plugins.functional.triton_tiles.Tiles`;
    checked inputs: see :func:`~.triton_kernel.triton_pair_histograms`): the custom op
    ``pml_rank::triton_pair_histograms`` under ``torch.compile``, :class:`EagerPairHistograms`
    otherwise (the same launches). Differentiable w.r.t. ``queries`` and ``refs`` (the same
    tensor for both: autograd adds the two gradients)."""
    sizes, precision = tiles.encode()
    args = (queries, refs, labels, ref_labels, self_columns, categories, float(offset),
            float(scale), int(num_intervals), sizes, precision)  # fmt: skip
    if torch.compiler.is_compiling():
        return histograms_op(*args)
    return EagerPairHistograms.apply(*args)


__all__ = ["EagerPairHistograms", "gradient_op", "histograms_op", "pair_histograms"]
