"""Shared test configuration, following PML's suite conventions.

Environment variables:
    TEST_DTYPES  comma-separated torch dtypes to test losses in (default ``float32,float64``).
    TEST_DEVICE  torch device for tensors (default ``cpu``). With ``TEST_DEVICE=cuda`` the tests
                 under :data:`DEVICE_TEST_DIRS` (every directory with tensor tests) run with that
                 device as torch's default device (tensors made without a device land on the
                 GPU); without a usable GPU those tests are skipped, with the reason printed by
                 ``-ra``. Every other test runs on the CPU as usual (``data/``, ``experiment/``,
                 ``running/``, ``reporting/``: pipelines that choose their device themselves,
                 with ``--device`` or a config; their GPU path is the kit's training part).

Device rules for a test in a device directory (``TEST_DEVICE=cpu``, the default, changes nothing):

* Random inputs: a seeded CPU ``torch.Generator`` passed to ``torch.randn``/``rand``/``randint``/
  ``randperm`` in a test file (anything under ``tests/``) draws on the CPU and lands on the test
  device (:class:`CpuDrawsOnTheTestDevice`), so the values are the CPU's on every device. Package
  code gets no such help: a draw there must name its device (the samplers' ``device="cpu"``).
  Other generator uses (``Tensor.normal_``, ``torch.multinomial``, ``torch.bernoulli`` with a
  generator) need a generator on the tensor's device, or CPU tensors moved with ``.to(device)``.
* Autocast on the test device: ``torch.autocast(TEST_DEVICE.type, ...)``, never ``"cpu"``.
* Host values: ``.cpu()`` before ``.numpy()``, and a CPU ``torch.from_numpy`` result moved with
  ``.to(device)`` before it meets device tensors; expected ``repr`` texts allow a ``device=`` part.
* Module-level tensors are made at import, on the CPU: make them inside the test (or a fixture).
* RNG state: ``torch.get_rng_state()`` is the CPU's; a CUDA test also compares
  ``torch.cuda.get_rng_state_all()`` (:func:`rng_states`).
* Backends: ``auto`` is the ``cpu`` backend on the CPU; on CUDA ``triton`` for float32 / float16 /
  bfloat16 embeddings where triton imports, else ``gpu`` (float64). A test of a value
  check (NaN/inf embeddings, index ranges, ``self_index`` values, pair weights) constructs the
  loss or miner with ``check_values=True`` (opt-in on ``gpu``/``triton``): without it an
  out-of-range index is clamped on the device and the loss made NaN instead of raising (before
  issue 49 it reached a CUDA kernel, whose device-side assert failed every later test of that
  pytest(-xdist) process). A test of what ``auto`` picks derives it from the tensors' device.
* DataLoader workers cannot use CUDA: a dataset read by ``num_workers > 0`` holds CPU tensors
  (``device="cpu"``).
* Weights files load on the CPU (``map_location="cpu"``): move such a model to the test device.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

TEST_DTYPES = [
    getattr(torch, name.strip())
    for name in os.environ.get("TEST_DTYPES", "float32,float64").split(",")
    if name.strip()
]
TEST_DEVICE = torch.device(os.environ.get("TEST_DEVICE", "cpu"))
DEVICE_TEST_DIRS = ("functional", "losses", "miners", "models", "samplers", "trainers", "utils")
TESTS_DIR = str(Path(__file__).resolve().parent) + os.sep


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
    """Whether ``item`` runs on ``TEST_DEVICE``: in :data:`DEVICE_TEST_DIRS` and not marked
    ``cpu_only``."""
    parts = item.path.relative_to(item.config.rootpath).parts
    in_dirs = len(parts) > 2 and parts[0] == "tests" and parts[1] in DEVICE_TEST_DIRS
    return in_dirs and item.get_closest_marker("cpu_only") is None


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cpu_only: checks behaviour that exists on the CPU only (torch's CPU threads): runs on the "
        "CPU whatever TEST_DEVICE",
    )


def pytest_collection_modifyitems(config, items):
    reason = device_unavailable_reason(TEST_DEVICE)
    if reason is None:
        return
    for item in items:
        if _on_device(item):
            item.add_marker(pytest.mark.skip(reason=reason))


class CpuDrawsOnTheTestDevice(TorchFunctionMode):
    """A random factory call (``torch.randn``, ``rand``, ``randint``, ``randperm``, ...) made in a
    test file with a CPU ``generator`` and no ``device`` draws on the CPU and returns the tensor on
    torch's default device (the test device), ``requires_grad`` kept on the moved leaf.

    Without it, such a call fails on CUDA (``Expected a 'cuda' device type for generator but found
    'cpu'``); drawing on the CPU keeps the CPU's values, so expectations tuned on the CPU hold on
    the GPU. Calls from the package (or PML) are left alone: the package must name its devices.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if (
            generator is None
            or generator.device.type != "cpu"
            or kwargs.get("device") is not None
            or func not in _device_constructors()
            or not sys._getframe(1).f_code.co_filename.startswith(TESTS_DIR)
        ):
            return func(*args, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False)
        drawn = func(*args, **kwargs, device="cpu").to(torch.get_default_device())
        return drawn.requires_grad_(requires_grad) if requires_grad else drawn


@pytest.fixture(autouse=True)
def _default_device(request):
    """Tests in the device directories make their tensors on ``TEST_DEVICE``."""
    if TEST_DEVICE.type == "cpu" or not _on_device(request.node):
        yield
        return
    previous = torch.get_default_device()
    torch.set_default_device(TEST_DEVICE)
    try:
        with CpuDrawsOnTheTestDevice():
            yield
    finally:
        torch.set_default_device(previous)


def rng_states() -> tuple:
    """The CPU RNG state and, once CUDA is initialized, every GPU's: equal tuples mean the same
    next draws on every device."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return (torch.get_rng_state(), *cuda)


def same_rng_states(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


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


@pytest.fixture
def meta_default_device():
    """torch's default device is ``meta`` for the test (restored after)."""
    before = torch.get_default_device()
    torch.set_default_device("meta")
    yield
    torch.set_default_device(before)
