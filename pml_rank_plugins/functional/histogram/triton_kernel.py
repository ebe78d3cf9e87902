"""A fused Triton kernel for the positive/negative soft histograms of the AP losses.

Same mathematics as :func:`~pml_rank_plugins.functional.histogram.cpu.pair_histograms` (the
reference; read its module docstring): for each query ``i`` and reference ``j`` the value
``u = offset + scale * q_i . r_j`` (bin units) is clamped to ``[0, L]`` and spread over the
``L + 1`` bin centres ``l`` with the triangular kernel ``max(0, 1 - |u - l|)`` (two-bin linear
interpolation); positives (category 0) go to ``h[i, 0]``, negatives (1) to ``h[i, 1]``, ignored
pairs (2, any other value) nowhere. Output ``(N, 2, L + 1)``.

Design (FlashAttention-style: the ``N x M`` scores never exist in memory):

* Forward: a program owns ``block_n`` query rows and a contiguous range of reference columns (a
  *split*); it loops over column tiles, computes the score tile ``Q R^T`` with ``tl.dot``
  (float32 accumulation, loop over the embedding width in ``block_k`` steps), maps it to bin units
  and adds, bin after bin, each row's kernel weights into ``(block_n, L + 1)`` positive and
  negative accumulators held in registers. Each split writes its own partial histograms; the
  splits are summed by one ``torch.sum`` in a fixed order: no atomics, deterministic.
* Backward: with ``g = dLoss/dh``, a pair in bin interval ``b = floor(u)`` (``0 <= u < L``) has
  ``dLoss/du = g[i, c, b + 1] - g[i, c, b]``, read from an ``(N, 2, L + 1)`` slope table
  (``O(N L)``, built by torch; its last column is 0). Clamped values (``u < 0`` or ``u >= L``)
  get zero; a value exactly on a bin centre gets the slope of the interval above it (the
  reference's kink convention). With ``dS = scale * dLoss/du``: ``grad_Q = dS R`` by programs
  over (query rows, embedding columns, column split), ``grad_R = dS^T Q`` by programs over
  (reference rows, embedding columns, row split); each recomputes its score tiles and writes only
  its own rows, splits summed by ``torch.sum``: deterministic, no atomics. ``refs`` may be
  ``queries`` itself: autograd adds the two gradients.

Cost: forward ``O(N M d)`` multiply-adds plus ``O(N M (L + 1))`` elementwise work (each bin is a
pass over the tile in registers; no scatter); backward two recomputations of the scores plus two
``O(N M d)`` products; extra memory ``O(splits N (L + 1) + splits (N + M) d)``, independent of
``N M``. Float32 only (half inputs are upcast; float64 is refused rather than silently rounded).

Precision: ``tl.dot`` runs with ``input_precision="tf32x3"`` by default: three TF32 tensor-core
products per tile (the split-float trick), float32 accuracy in practice, where plain ``"tf32"``
(10-bit mantissas) would move scores across bin edges and ``"ieee"`` runs on the CUDA cores,
3-4x slower at N >= 4096. Measured on one H200 (triton 3.6, N = 300, M = 257, d = 100, L = 10 to 127,
against the float64 torch kernel): largest histogram difference 1e-5 to 3.4e-5 (ieee: 1.1e-5 to
3.2e-5), largest gradient difference 2.1e-7 to 3.0e-7 of the largest entry (ieee: 1.3e-7 to
2.4e-7). Forward + backward, d = 128, L = 10, self-ranking, against ``S = X X^T;
(S * S).sum().backward()`` (the floor): 2.2x the floor at N = 4096 (1.5 ms; the torch kernel
11-18 ms), 1.7x at N = 16384 and N = 65536 (ieee: 6-7.5x). :class:`Tiles` changes the tile
sizes and the precision (``benchmarks/bench_histogram_triton.py`` sweeps them); it, the grid
sizing and the score tile are shared with the Ranked List kernel
(:mod:`pml_rank_plugins.functional.triton_tiles`).

Under ``torch.compile`` the kernels are two ``torch.library`` custom ops,
``pml_rank::triton_pair_histograms`` and its backward (:mod:`.triton_ops`, launch code in
:mod:`.triton_launch`): opaque to dynamo and inductor, with fake implementations for the shapes,
so a loss on this backend compiles with ``fullgraph=True``.

Triton is optional: without it this module imports, and :func:`triton_pair_histograms` raises.
On CPU the kernels run only in Triton's interpreter: ``TRITON_INTERPRET=1`` must be set before
this module (precisely: :mod:`.triton_jit`, the kernels) is first imported in the process;
``triton.jit`` reads it when it decorates each kernel, not at launch (triton 3.8).
"""

from __future__ import annotations

import torch

from ..triton_tiles import DEFAULT_TILES, Tiles
from . import triton_jit, triton_ops
from .triton_jit import triton

# At most this many bin centres (L + 1): two (block_n, bins) float32 accumulators stay in
# registers. FastAP's num_bins is L (<= 127 here), mAP_Q's num_bins is L + 1 (<= 128 here).
MAX_BINS = 128
MAX_INTERVALS = MAX_BINS - 1


def interpreted() -> bool:
    """Whether the kernels were defined in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton is not None and type(triton_jit.forward_kernel).__name__ == "InterpretedFunction"


def triton_available_for(device: torch.device | str) -> bool:
    """Whether :func:`triton_pair_histograms` can run on ``device``: triton is importable and the
    device is CUDA, or the kernels run in the interpreter (then CPU tensors). O(1)."""
    if triton is None:
        return False
    kind = torch.device(device).type
    return kind == "cpu" if interpreted() else kind == "cuda"


def _check_index(tensor, name: str, length: int, device: torch.device) -> torch.Tensor:
    """A 1-D integer tensor of ``length`` entries on ``device``, as contiguous int64."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 1 or len(tensor) != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(tensor.shape)}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, the embeddings on {device}")
    return tensor.to(torch.int64).contiguous()


def _check_embeddings(queries, refs) -> tuple[torch.Tensor, torch.Tensor]:
    for name, x in (("queries", queries), ("refs", refs)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a 2-D (rows, d) tensor, got {shape}")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(
                f"{name} is {x.dtype}; the triton kernel computes in float32 and takes float32, "
                "float16 or bfloat16 (use the cpu or gpu backend for float64)"
            )
    if queries.shape[1] != refs.shape[1]:
        raise ValueError(f"queries have d = {queries.shape[1]} columns, refs {refs.shape[1]}")
    if queries.device != refs.device:
        raise ValueError(f"queries are on {queries.device}, refs on {refs.device}")
    # Upcasting is differentiable: half inputs get their gradients back in their own dtype.
    return queries.float(), refs.float()


def triton_pair_histograms(
    queries: torch.Tensor,
    refs: torch.Tensor,
    labels: torch.Tensor | None,
    ref_labels: torch.Tensor | None,
    self_columns: torch.Tensor | None,
    offset: float,
    scale: float,
    num_intervals: int,
    categories: torch.Tensor | None = None,
    tiles: Tiles = DEFAULT_TILES,
) -> torch.Tensor:
    """Positive/negative soft histograms ``(N, 2, num_intervals + 1)`` by the fused kernel.

    Equal to :func:`~pml_rank_plugins.functional.histogram.cpu.pair_histograms` to float32
    rounding, values and gradients (module docstring). Differentiable w.r.t. ``queries`` and
    ``refs`` (``refs`` may be ``queries``).

    Args:
        queries: ``(N, d)`` embeddings; refs: ``(M, d)`` (float32, or float16/bfloat16 upcast).
        labels, ref_labels: ``(N,)`` / ``(M,)`` integer class ids (equal: positive pair, else
            negative); unused (may be ``None``) when ``categories`` is given.
        self_columns: ``(N,)`` integers, each query's own column, ignored (or ``None``).
        offset, scale: the value in bin units is ``offset + scale * q.r``.
        num_intervals: ``L``, 1 to :data:`MAX_INTERVALS` (``L + 1`` bin centres).
        categories: optional ``(N, M)`` int8 (0 positive, 1 negative, else ignored), used
            instead of the labels (a miner's pairs). Values are not read back to the host.
        tiles: launch parameters (:class:`Tiles`).

    Raises ``RuntimeError`` when triton cannot run on the tensors' device (see
    :func:`triton_available_for`), ``ValueError`` / ``TypeError`` for malformed inputs and for
    ``num_intervals`` beyond :data:`MAX_INTERVALS`.
    """
    queries, refs = _check_embeddings(queries, refs)
    device, n, m = queries.device, len(queries), len(refs)
    if isinstance(num_intervals, bool) or not isinstance(num_intervals, int) or num_intervals < 1:
        raise ValueError(f"num_intervals must be an integer >= 1, got {num_intervals!r}")
    if num_intervals > MAX_INTERVALS:
        raise ValueError(
            f"the triton histogram kernel supports at most {MAX_BINS} bin centres "
            f"(num_intervals <= {MAX_INTERVALS}: FastAP num_bins <= {MAX_INTERVALS}, "
            f"mAP_Q num_bins <= {MAX_BINS}); got num_intervals = {num_intervals}. "
            "Use the cpu or gpu backend for more bins"
        )
    if categories is not None:
        if not isinstance(categories, torch.Tensor) or categories.dtype != torch.int8:
            got = categories.dtype if isinstance(categories, torch.Tensor) else type(categories)
            raise TypeError(f"categories must be an int8 tensor, got {got}")
        if tuple(categories.shape) != (n, m):
            raise ValueError(f"categories must have shape {(n, m)}, got {tuple(categories.shape)}")
        if categories.device != device:
            raise ValueError(f"categories are on {categories.device}, the embeddings on {device}")
        labels = ref_labels = self_columns = None
    else:
        if labels is None or ref_labels is None:
            raise ValueError("labels and ref_labels are required when categories is None")
        labels = _check_index(labels, "labels", n, device)
        ref_labels = _check_index(ref_labels, "ref_labels", m, device)
        if self_columns is not None:
            self_columns = _check_index(self_columns, "self_columns", n, device)
    if triton is None:
        raise RuntimeError(
            "the triton histogram kernel needs the triton package, which cannot be imported"
        )
    if not triton_available_for(device):
        raise RuntimeError(
            f"the triton histogram kernel runs on CUDA tensors (or on CPU tensors in Triton's "
            f"interpreter: TRITON_INTERPRET=1 set before this module is imported); got {device}"
            + (" with the interpreter on" if interpreted() else "")
        )
    # The custom op pml_rank::triton_pair_histograms (triton_ops): opaque to torch.compile.
    return triton_ops.pair_histograms(queries, refs, labels, ref_labels, self_columns, categories,
                                      offset, scale, num_intervals, tiles)  # fmt: skip
