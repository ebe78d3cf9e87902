"""What the two fused Triton kernels share: the launch parameters, their launch sizing and the
score tile.

The histogram kernel (:mod:`.histogram.triton_kernel`) and the Ranked List kernel
(:mod:`.ranked_list.triton_kernel`) have one design (FlashAttention-style: a program owns
``block_n`` query rows, loops over ``block_m`` reference columns of one contiguous *split*, and
recomputes each ``(block_n, block_m)`` tile of ``S = Q R^T`` with ``tl.dot`` instead of storing
the ``N x M`` scores; the two gradient kernels own rows of ``grad_Q`` / ``grad_R`` and loop over
a split of the other side). So they take the same launch parameters, size their grids the same
way and compute the score tile with the same code; that lives here, once, so that a tuning or a
fix of one kernel is a tuning or a fix of both:

* :class:`Tiles`, the launch parameters, and its one encoding for the ``torch.library`` custom
  operators' schemas (:meth:`Tiles.encode` / :meth:`Tiles.decode`: ``int[]`` and ``str``);
* the launch sizing: :func:`target_programs` (how many programs fill the device), :func:`split`
  (the looped dimension cut into whole-tile splits), :func:`width_block` (the ``tl.dot`` width
  clamp), :func:`forward_grid` / :func:`gradient_grid` and :func:`on_device`;
* :func:`score_tile`, the ``triton.jit`` tile of ``Q R^T`` that every kernel of both families
  calls (Triton resolves a called jit function through the caller's globals, so each
  ``triton_jit`` module imports it and the kernels inline it).

Triton is optional: without it this module imports (:class:`Tiles` and the sizing helpers exist;
the sizing helpers are only called by launches, which need triton) and :func:`score_tile` is not
defined. ``TRITON_INTERPRET=1`` must be set before this module is first imported for
:func:`score_tile` to run on CPU (``triton.jit`` reads it when decorating, triton 3.8), the same
condition as for the kernels that import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Optional

import torch

try:  # Triton is optional; the torch kernels stay the reference and the fallback.
    import triton
    import triton.language as tl
except ImportError:  # tested in-process by hiding the module (the kernels' tests)
    triton = None


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Launch parameters of both fused kernels, in one place so that a benchmark can sweep them.

    ``block_n`` query rows x ``block_m`` reference columns per score tile (both >= 16 for
    ``tl.dot``, powers of two), ``block_k`` embedding columns per ``tl.dot`` step, ``block_d``
    (at most) gradient columns per backward program; ``target_programs``: the splits of the
    column (forward, ``grad_Q``) or row (``grad_R``) loop are chosen to launch about this many
    programs (``None``: ``programs_per_sm`` x the GPU's multiprocessor count; 1 on CPU; a count
    below 1 counts as 1), so that small batches still fill the GPU; ``precision``: ``tl.dot``'s
    ``input_precision`` (``"tf32x3"``: tensor cores at float32 accuracy; ``"ieee"``: CUDA cores,
    slower; ``"tf32"`` is not float32-accurate). The defaults were the fastest or within noise of
    it for the histogram kernel on an H200 (:mod:`.histogram.triton_kernel`); the Ranked List
    kernel is untuned on a GPU and uses them too. The interpreter ignores ``precision`` and
    ``num_warps`` / ``num_stages``.
    """

    block_n: int = 64
    block_m: int = 64
    block_k: int = 32
    block_d: int = 128
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 4
    target_programs: Optional[int] = None
    precision: str = "tf32x3"

    def encode(self) -> tuple[list[int], str]:
        """``(sizes, precision)``: these tiles as the custom operators take them (``int[]``,
        ``str``): the eight integer fields in order, ``target_programs`` ``-1`` for ``None``."""
        target = -1 if self.target_programs is None else int(self.target_programs)
        sizes = [self.block_n, self.block_m, self.block_k, self.block_d, self.num_warps,
                 self.num_stages, self.programs_per_sm, target]  # fmt: skip
        return [int(size) for size in sizes], str(self.precision)

    @classmethod
    def decode(cls, sizes: Sequence[int], precision: str) -> Tiles:
        """The inverse of :meth:`encode` (a negative ``target_programs`` is ``None``)."""
        *fixed, target = (int(size) for size in sizes)
        return cls(*fixed, target_programs=None if target < 0 else target, precision=precision)


DEFAULT_TILES = Tiles()
_MULTIPROCESSORS: dict[int, int] = {}


def target_programs(device: torch.device, tiles: Tiles) -> int:
    """About how many programs a launch should have to fill ``device``: ``tiles.target_programs``
    (at least 1), else ``programs_per_sm`` x the multiprocessor count (read once per GPU), 1 off
    CUDA (the interpreter runs programs one after another)."""
    if tiles.target_programs is not None:
        return max(1, tiles.target_programs)
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return tiles.programs_per_sm * _MULTIPROCESSORS[index]


def split(length: int, block: int, other_programs: int, target: int) -> tuple[int, int]:
    """``(splits, elements per split)``: the looped dimension (``length``, in ``block`` tiles)
    cut into contiguous whole-tile ranges so that ``other_programs * splits`` is about
    ``target``. Each split's partial result is summed in a fixed order by the caller (no
    atomics)."""
    tiles = triton.cdiv(length, block)
    wanted = min(tiles, max(1, triton.cdiv(target, other_programs)))
    per_split = triton.cdiv(tiles, wanted) * block
    return triton.cdiv(length, per_split), per_split


def width_block(block: int, width: int) -> int:
    """``block`` clamped to the next power of two of ``width`` (no wasted columns for a narrow
    embedding) and to at least 16 (``tl.dot``'s smallest operand)."""
    return max(16, min(block, triton.next_power_of_2(max(width, 1))))


def forward_grid(n: int, m: int, tiles: Tiles, target: int) -> tuple[tuple[int, int], int]:
    """``((row blocks, splits), columns per split)`` of a forward launch: programs over query
    row blocks x column splits."""
    row_blocks = triton.cdiv(n, tiles.block_n)
    splits, split_cols = split(m, tiles.block_m, row_blocks, target)
    return (row_blocks, splits), split_cols


def gradient_grid(
    n: int, m: int, d: int, tiles: Tiles, target: int, of_queries: bool
) -> tuple[tuple[int, int, int], int, int]:
    """``(grid, elements per split, block_d)`` of a gradient launch: programs over the owned
    rows (queries if ``of_queries``, else references) x embedding column blocks x splits of the
    looped side (the other one)."""
    block_d = width_block(tiles.block_d, d)
    owned, looped = (n, m) if of_queries else (m, n)
    owned_block, looped_block = (
        (tiles.block_n, tiles.block_m) if of_queries else (tiles.block_m, tiles.block_n)
    )
    programs = triton.cdiv(owned, owned_block) * triton.cdiv(d, block_d)
    splits, per_split = split(looped, looped_block, programs, target)
    return (triton.cdiv(owned, owned_block), triton.cdiv(d, block_d), splits), per_split, block_d


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """The context a launch runs in: ``device`` made current on CUDA (a kernel launches on the
    current device, which need not be the tensors'), nothing elsewhere."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


if triton is not None:
    # Dense kernel signatures: black's one argument per line would double the function.
    # fmt: off

    @triton.jit
    def score_tile(q_ptr, r_ptr, rows, cols, row_ok, col_ok, d, sqn, sqd, srm, srd,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
        """The ``(BLOCK_N, BLOCK_M)`` tile of ``Q R^T`` (float32), ``BLOCK_K`` columns at a time;
        rows and columns outside the matrices read zeros. ``O(BLOCK_N BLOCK_M d)``."""
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(0, d, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < d
            q = tl.load(q_ptr + rows[:, None] * sqn + ks[None, :] * sqd,
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            r = tl.load(r_ptr + cols[None, :] * srm + ks[:, None] * srd,
                        mask=col_ok[None, :] & k_ok[:, None], other=0.0)
            acc = tl.dot(q, r, acc, input_precision=PRECISION)
        return acc
    # fmt: on
