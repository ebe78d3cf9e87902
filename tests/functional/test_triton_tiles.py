"""What the two fused Triton kernels share (:mod:`pml_rank_plugins.functional.triton_tiles`): one
:class:`Tiles` class under every old name, its schema encoding, and the launch sizing, against
hand-worked values. The score tile runs in every kernel: the interpreter tests of both families
(``tests/functional/histogram``, ``tests/functional/ranked_list``) check it against the torch
references."""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import types

import pytest
import torch

from pml_rank_plugins import functional
from pml_rank_plugins.functional import triton_tiles
from pml_rank_plugins.functional.backend import triton_available
from pml_rank_plugins.functional.histogram import triton_kernel as histogram_kernel
from pml_rank_plugins.functional.histogram import triton_launch
from pml_rank_plugins.functional.ranked_list import triton_kernel as ranked_list_kernel
from pml_rank_plugins.functional.triton_tiles import DEFAULT_TILES, Tiles

needs_triton = pytest.mark.skipif(
    not triton_available(), reason="triton is not installed (it is optional)"
)


def test_both_kernel_families_name_the_one_tiles_class():
    for module in (histogram_kernel, triton_launch, ranked_list_kernel):
        assert module.Tiles is Tiles and module.DEFAULT_TILES is DEFAULT_TILES
    assert DEFAULT_TILES == Tiles(64, 64, 32, 128, 4, 2, 4, None, "tf32x3")


@pytest.mark.parametrize(
    "tiles",
    [
        DEFAULT_TILES,
        Tiles(block_n=16, block_m=16, block_k=16, block_d=16, target_programs=8),
        Tiles(block_k=64, target_programs=1, precision="ieee"),
    ],
)
def test_tile_encoding_round_trips(tiles):
    sizes, precision = tiles.encode()
    assert all(type(size) is int for size in sizes) and len(sizes) == 8
    assert type(precision) is str
    assert sizes[-1] == (-1 if tiles.target_programs is None else tiles.target_programs)
    assert Tiles.decode(sizes, precision) == tiles


def test_encoding_field_order():
    sizes, precision = Tiles(1, 2, 3, 4, 5, 6, 7, 8, "tf32").encode()
    assert (sizes, precision) == ([1, 2, 3, 4, 5, 6, 7, 8], "tf32")


def test_target_programs_off_cuda_and_given():
    cpu = torch.device("cpu")
    assert triton_tiles.target_programs(cpu, DEFAULT_TILES) == 1
    assert triton_tiles.target_programs(cpu, Tiles(target_programs=7)) == 7
    assert triton_tiles.target_programs(cpu, Tiles(target_programs=0)) == 1  # at least one


def test_target_programs_on_cuda_reads_the_multiprocessors_once(monkeypatch):
    """No GPU needed: the device properties are faked, the per-device cache is checked."""
    calls = []

    def properties(index):
        calls.append(index)
        return types.SimpleNamespace(multi_processor_count=132)

    monkeypatch.setattr(triton_tiles, "_MULTIPROCESSORS", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    gpu = torch.device("cuda", 3)
    assert triton_tiles.target_programs(gpu, DEFAULT_TILES) == 4 * 132
    assert triton_tiles.target_programs(gpu, Tiles(programs_per_sm=2)) == 2 * 132
    assert triton_tiles.target_programs(gpu, Tiles(target_programs=5)) == 5
    assert calls == [3]


@needs_triton
@pytest.mark.parametrize(
    "args, expected",
    [
        ((1000, 64, 4, 32), (8, 128)),  # 16 tiles, 8 splits of 2 tiles
        ((100, 16, 1, 1), (1, 112)),  # one split: 7 whole tiles
        ((100, 16, 50, 8), (1, 112)),  # enough programs already
        ((100, 16, 1, 100), (7, 16)),  # at most one split per tile
        ((65, 16, 2, 8), (3, 32)),  # 5 tiles wanted in 4 splits: 2 tiles each, so 3
    ],
)
def test_split_cuts_whole_tiles(args, expected):
    length, block, _, _ = args
    splits, per_split = triton_tiles.split(*args)
    assert (splits, per_split) == expected
    assert per_split % block == 0  # whole tiles
    assert (splits - 1) * per_split < length <= splits * per_split  # each element once


@needs_triton
@pytest.mark.parametrize(
    "block, width, expected",
    [(32, 1, 16), (32, 20, 32), (32, 100, 32), (128, 3, 16), (128, 100, 128), (64, 17, 32)],
)
def test_width_block(block, width, expected):
    assert triton_tiles.width_block(block, width) == expected


@needs_triton
def test_forward_grid():
    tiles = Tiles(block_n=16, block_m=16)
    # 7 row blocks; 40 columns are 3 tiles, ceil(20 / 7) = 3 splits of one tile.
    assert triton_tiles.forward_grid(100, 40, tiles, 20) == ((7, 3), 16)
    assert triton_tiles.forward_grid(100, 40, tiles, 1) == ((7, 1), 48)


@needs_triton
def test_gradient_grid_owns_one_side_and_splits_the_other():
    tiles = Tiles(block_n=16, block_m=32, block_d=128)
    # grad_Q: 7 query blocks x 1 column block (d = 20: block_d 32); 40 refs in one split.
    assert triton_tiles.gradient_grid(100, 40, 20, tiles, 1, True) == ((7, 1, 1), 64, 32)
    # grad_R: 2 reference blocks x 1; 100 queries (7 tiles of 16) in ceil(8 / 2) = 4 splits.
    grid, per_split, block_d = triton_tiles.gradient_grid(100, 40, 20, tiles, 8, False)
    assert (grid, per_split, block_d) == ((2, 1, 4), 32, 32)
    assert math.ceil(100 / per_split) == grid[2]


def test_on_device_makes_the_tensors_gpu_current_and_nothing_else():
    # Built, not entered: entering would need a GPU.
    context = triton_tiles.on_device(torch.device("cuda", 1))
    assert isinstance(context, torch.cuda.device) and context.idx == 1
    for kind in ("cpu", "meta"):
        assert isinstance(triton_tiles.on_device(torch.device(kind)), contextlib.nullcontext)


def test_module_imports_without_triton(monkeypatch):
    """Without triton the tiles and their encoding exist and the jit score tile does not (the
    kernels' own modules then define no kernel: their tests check that they import)."""
    monkeypatch.setitem(sys.modules, "triton", None)  # ``import triton`` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    # A fresh import; sys.modules and the package's attribute are restored after.
    monkeypatch.setattr(functional, "triton_tiles", triton_tiles)
    monkeypatch.delitem(sys.modules, triton_tiles.__name__)
    module = importlib.import_module(triton_tiles.__name__)
    assert module is not triton_tiles and module.triton is None
    assert not hasattr(module, "score_tile") and hasattr(triton_tiles, "score_tile") is (
        triton_available()
    )
    tiles = module.Tiles(block_n=16, target_programs=3)
    assert module.Tiles.decode(*tiles.encode()) == tiles
    assert module.target_programs(torch.device("cpu"), tiles) == 3
