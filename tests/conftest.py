"""Shared test configuration, following PML's suite conventions.

Environment variables:
    TEST_DTYPES  comma-separated torch dtypes to test losses in (default ``float32,float64``).
    TEST_DEVICE  torch device for tensors (default ``cpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

TEST_DTYPES = [
    getattr(torch, name.strip())
    for name in os.environ.get("TEST_DTYPES", "float32,float64").split(",")
    if name.strip()
]
TEST_DEVICE = torch.device(os.environ.get("TEST_DEVICE", "cpu"))

# Two cores are shared by pytest-xdist workers; more intra-op threads only thrash.
torch.set_num_threads(1)


def make_embeddings_and_labels(
    n: int = 32,
    dim: int = 8,
    num_classes: int = 4,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: torch.device = TEST_DEVICE,
    requires_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (n, dim) embeddings and (n,) labels with every class present at least twice."""
    if n < 2 * num_classes:
        raise ValueError("need at least two samples per class")
    gen = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(n, dim, generator=gen, dtype=torch.float64).to(dtype)
    labels = torch.arange(n) % num_classes
    labels = labels[torch.randperm(n, generator=gen)]
    embeddings = embeddings.to(device).requires_grad_(requires_grad)
    return embeddings, labels.to(device)


@pytest.fixture(params=TEST_DTYPES, ids=[str(d).replace("torch.", "") for d in TEST_DTYPES])
def dtype(request) -> torch.dtype:
    return request.param


@pytest.fixture
def device() -> torch.device:
    return TEST_DEVICE


@pytest.fixture
def embeddings_and_labels(dtype, device):
    """(32, 8) embeddings in the test dtype with labels from 4 classes, 8 samples each."""
    return make_embeddings_and_labels(dtype=dtype, device=device)
