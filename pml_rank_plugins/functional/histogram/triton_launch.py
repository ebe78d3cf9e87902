"""The launch side of the fused Triton histogram kernels: the shared arguments and the three
launches (forward, ``grad_Q``, ``grad_R``). The design is in :mod:`.triton_kernel`, the kernels
in :mod:`.triton_jit`, the ``torch.library`` custom ops that call these launches in
:mod:`.triton_ops`; :class:`Tiles` and the grid sizing (splits, programs per device), shared with
the Ranked List kernel, in :mod:`pml_rank_plugins.functional.triton_tiles`.

Everything here runs on concrete tensors only (the custom ops' real implementations): under
``torch.compile`` the ops are opaque and their fake implementations give the shapes.
"""

from __future__ import annotations

import struct

import torch

from .. import triton_tiles
from ..triton_tiles import DEFAULT_TILES, Tiles
from . import triton_jit
from .triton_jit import triton

# Up to this many bins the per-bin loop is unrolled (each bin's column of the accumulators is then
# known at compile time); beyond it, a runtime loop (shorter compile).
UNROLL_MAX_BINS = 32


def _float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (``float(torch.tensor(value, dtype=float32))``
    without a tensor)."""
    return struct.unpack("f", struct.pack("f", value))[0]


class Launch:
    """The arguments every kernel shares, built once per forward and reused in backward."""

    def __init__(self, queries, refs, labels, ref_labels, self_columns, categories, offset, scale,
                 num_intervals, tiles):  # fmt: skip
        dense = categories is not None
        # Unused pointers are never read (their branch is compiled out): any tensor will do, and
        # no placeholder is allocated (on CUDA that would cost a kernel launch per call).
        dummy = queries
        cat = categories if dense else dummy
        self.pointers = (
            queries,
            refs,
            dummy if dense else labels,
            dummy if dense else ref_labels,
            self_columns if (self_columns is not None and not dense) else dummy,
            cat,
        )
        self.sizes = (len(queries), len(refs), queries.shape[1])
        self.strides = (*queries.stride(), *refs.stride(), *(cat.stride() if dense else (0, 0)))
        # The reference adds offset + 1 (a float32) to scale * s: the same numbers here. Rounded
        # to float32 in Python (struct, round to nearest even, as torch): no host tensor and no
        # scalar read, so the operator trace has neither (CUDA graphs, utils.op_count.OpTrace).
        self.affine = (_float32(offset + 1.0), float(scale))
        self.flags = dict(
            NUM_BINS=num_intervals + 1,
            BLOCK_K=triton_tiles.width_block(tiles.block_k, self.sizes[2]),
            DENSE=dense,
            HAS_SELF=self_columns is not None and not dense,
            PRECISION=tiles.precision,
        )
        self.tiles = tiles
        self.target = triton_tiles.target_programs(queries.device, tiles)

    def run(self, kernel, grid, tensors, split, **flags):
        """Launches ``kernel`` with the shared arguments around the kernel's own output
        ``tensors`` and its split length."""
        options = dict(num_warps=self.tiles.num_warps, num_stages=self.tiles.num_stages)
        with triton_tiles.on_device(self.pointers[0].device):
            kernel[grid](*self.pointers, *tensors, *self.sizes, *self.strides, *self.affine, split,
                         **self.flags, **flags, **options)  # fmt: skip


def forward_histograms(launch: Launch) -> torch.Tensor:
    """``(N, 2, L + 1)`` float32 histograms: the forward kernel's splits, summed in a fixed
    order (no atomics)."""
    n, m, _ = launch.sizes
    tiles, bins = launch.tiles, launch.flags["NUM_BINS"]
    grid, split_cols = triton_tiles.forward_grid(n, m, tiles, launch.target)
    splits = grid[1]
    out = launch.pointers[0].new_empty(splits, n, 2, bins)
    launch.run(triton_jit.forward_kernel, grid, (out,), split_cols,
               BLOCK_L=triton.next_power_of_2(bins), UNROLL=bins <= UNROLL_MAX_BINS,
               BLOCK_N=tiles.block_n, BLOCK_M=tiles.block_m)  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)


def gradient(launch: Launch, slope: torch.Tensor, of_queries: bool) -> torch.Tensor:
    """``dS R`` (``of_queries``) or ``dS^T Q``, split over the looped dimension and summed."""
    n, m, d = launch.sizes
    tiles = launch.tiles
    grid, per_split, block_d = triton_tiles.gradient_grid(n, m, d, tiles, launch.target, of_queries)
    splits = grid[2]
    out = slope.new_empty(splits, n if of_queries else m, d)
    kernel = triton_jit.grad_queries_kernel if of_queries else triton_jit.grad_refs_kernel
    launch.run(kernel, grid, (slope, out), per_split, BLOCK_N=tiles.block_n,
               BLOCK_M=tiles.block_m, BLOCK_D=block_d)  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)


# Tiles and DEFAULT_TILES are re-exported: this module was their home before triton_tiles.
__all__ = ["DEFAULT_TILES", "UNROLL_MAX_BINS", "Launch", "Tiles", "forward_histograms", "gradient"]
