"""Shared test configuration, following PML's suite conventions.

Environment variables:
    TEST_DTYPES  comma-separated torch dtypes to test losses in (default ``float32,float64``).
    TEST_DEVICE  torch device for tensors (default ``cpu``). With ``TEST_DEVICE=cuda`` the tests
                 under ``losses/``, ``miners/``, ``samplers/`` and ``trainers/`` run with that
                 device as torch's default device (tensors made without a device land on the
                 GPU); without a usable GPU those tests are skipped, with the reason printed by
                 ``-ra``. Every other test runs on the CPU as usual.
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
DEVICE_TEST_DIRS = ("losses", "miners", "samplers", "trainers", "utils")


def device_unavailable_reason(device: torch.device) -> str | None:
    """Why ``device`` cannot run tests here, or ``None`` when it can."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"TEST_DEVICE={device} but no CUDA GPU is available (torch.cuda.is_available())"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"TEST_DEVICE={device} but only {torch.cuda.device_count()} GPUs are visible"
    elif device.type != "cpu":
        return f"TEST_DEVICE={device}: only cpu and cuda devices are supported by this suite"
    return None


def _on_device(item) -> bool:
    parts = item.path.relative_to(item.config.rootpath).parts
    return len(parts) > 2 and parts[0] == "tests" and parts[1] in DEVICE_TEST_DIRS


def pytest_collection_modifyitems(config, items):
    reason = device_unavailable_reason(TEST_DEVICE)
    if reason is None:
        return
    for item in items:
        if _on_device(item):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _default_device(request):
    """Tests in the device directories make their tensors on ``TEST_DEVICE``."""
    if TEST_DEVICE.type == "cpu" or not _on_device(request.node):
        yield
        return
    previous = torch.get_default_device()
    torch.set_default_device(TEST_DEVICE)
    try:
        yield
    finally:
        torch.set_default_device(previous)


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
    gen = torch.Generator(device="cpu").manual_seed(seed)  # same values on every device
    embeddings = torch.randn(n, dim, generator=gen, dtype=torch.float64, device="cpu").to(dtype)
    labels = torch.arange(n, device="cpu") % num_classes
    labels = labels[torch.randperm(n, generator=gen, device="cpu")]
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


@pytest.fixture
def png_plots_only(monkeypatch):
    """The plots of ``tune``, ``compare`` and ``sweep`` (this process's) written as PNG, without
    their PDF copy, for a test that reads no PDF (see ``tests/png_plots.py``)."""
    # imported here: it loads the reporting package (about 0.7 s), which a run of, e.g., only
    # the kernel or loss tests (gpu_check's tests part) never needs
    from tests.png_plots import use_png_plots_only

    use_png_plots_only(monkeypatch)
