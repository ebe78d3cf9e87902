"""The launch side of the fused Triton histogram kernels: tile sizes, splits, the shared
arguments and the three launches (forward, ``grad_Q``, ``grad_R``). The design is in
:mod:`.triton_kernel`, the kernels in :mod:`.triton_jit`, the ``torch.library`` custom ops that
call these launches in :mod:`.triton_ops`.

Everything here runs on concrete tensors only (the custom ops' real implementations): under
``torch.compile`` the ops are opaque and their fake implementations give the shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct

import torch

from . import triton_jit
from .triton_jit import triton

# Up to this many bins the per-bin loop is unrolled (each bin's column of the accumulators is then
# known at compile time); beyond it, a runtime loop (shorter compile).
UNROLL_MAX_BINS = 32


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Launch parameters, in one place so that a benchmark can sweep them.

    ``block_n`` query rows x ``block_m`` reference columns per score tile (both >= 16 for
    ``tl.dot``), ``block_k`` embedding columns per ``tl.dot`` step, ``block_d`` (at most) gradient
    columns per backward program; ``target_programs``: the splits of the column (forward,
    ``grad_Q``) or row (``grad_R``) loop are chosen to launch about this many programs (``None``:
    ``programs_per_sm`` x the GPU's multiprocessor count; 1 on CPU), so that small batches still
    fill the GPU; ``precision``: ``tl.dot``'s ``input_precision`` (``"tf32x3"``: tensor cores at
    float32 accuracy; ``"ieee"``: CUDA cores, slower; ``"tf32"`` is not float32-accurate). The
    defaults were the fastest or within noise of it on an H200 (module docstring); the
    interpreter ignores ``precision`` and ``num_warps`` / ``num_stages``.
    """

    block_n: int = 64
    block_m: int = 64
    block_k: int = 32
    block_d: int = 128
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 4
    target_programs: int | None = None
    precision: str = "tf32x3"


DEFAULT_TILES = Tiles()
_MULTIPROCESSORS: dict[int, int] = {}


def _target_programs(device: torch.device, tiles: Tiles) -> int:
    """About how many programs a launch should have to fill ``device``."""
    if tiles.target_programs is not None:
        return max(1, tiles.target_programs)
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return tiles.programs_per_sm * _MULTIPROCESSORS[index]


def _split(length: int, block: int, other_programs: int, target: int) -> tuple[int, int]:
    """``(splits, elements per split)``: the looped dimension (``length``, in ``block`` tiles)
    cut into contiguous whole-tile ranges so that ``other_programs * splits`` is about
    ``target``."""
    tiles = triton.cdiv(length, block)
    wanted = min(tiles, max(1, triton.cdiv(target, other_programs)))
    per_split = triton.cdiv(tiles, wanted) * block
    return triton.cdiv(length, per_split), per_split


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
            BLOCK_K=max(16, min(tiles.block_k, triton.next_power_of_2(max(self.sizes[2], 1)))),
            DENSE=dense,
            HAS_SELF=self_columns is not None and not dense,
            PRECISION=tiles.precision,
        )
        self.tiles = tiles
        self.target = _target_programs(queries.device, tiles)

    def run(self, kernel, grid, tensors, split, **flags):
        """Launches ``kernel`` with the shared arguments around the kernel's own output
        ``tensors`` and its split length."""
        options = dict(num_warps=self.tiles.num_warps, num_stages=self.tiles.num_stages)
        with (
            torch.cuda.device(self.pointers[0].device)
            if self.pointers[0].is_cuda
            else contextlib.nullcontext()
        ):
            kernel[grid](*self.pointers, *tensors, *self.sizes, *self.strides, *self.affine, split,
                         **self.flags, **flags, **options)  # fmt: skip


def forward_histograms(launch: Launch) -> torch.Tensor:
    """``(N, 2, L + 1)`` float32 histograms: the forward kernel's splits, summed in a fixed
    order (no atomics)."""
    n, m, _ = launch.sizes
    tiles, bins = launch.tiles, launch.flags["NUM_BINS"]
    row_blocks = triton.cdiv(n, tiles.block_n)
    splits, split_cols = _split(m, tiles.block_m, row_blocks, launch.target)
    queries = launch.pointers[0]
    out = queries.new_empty(splits, n, 2, bins)
    launch.run(triton_jit.forward_kernel, (row_blocks, splits), (out,), split_cols,
               BLOCK_L=triton.next_power_of_2(bins), UNROLL=bins <= UNROLL_MAX_BINS,
               BLOCK_N=tiles.block_n, BLOCK_M=tiles.block_m)  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)


def gradient(launch: Launch, slope: torch.Tensor, of_queries: bool) -> torch.Tensor:
    """``dS R`` (``of_queries``) or ``dS^T Q``, split over the looped dimension and summed."""
    n, m, d = launch.sizes
    tiles = launch.tiles
    block_d = max(16, min(tiles.block_d, triton.next_power_of_2(max(d, 1))))
    owned, looped = (n, m) if of_queries else (m, n)
    owned_block, looped_block = (
        (tiles.block_n, tiles.block_m) if of_queries else (tiles.block_m, tiles.block_n)
    )
    programs = triton.cdiv(owned, owned_block) * triton.cdiv(d, block_d)
    splits, per_split = _split(looped, looped_block, programs, launch.target)
    out = slope.new_empty(splits, owned, d)
    kernel = triton_jit.grad_queries_kernel if of_queries else triton_jit.grad_refs_kernel
    grid = (triton.cdiv(owned, owned_block), triton.cdiv(d, block_d), splits)
    launch.run(kernel, grid, (slope, out), per_split, BLOCK_N=tiles.block_n,
               BLOCK_M=tiles.block_m, BLOCK_D=block_d)  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)
