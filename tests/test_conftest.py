"""``TEST_DEVICE``: device tests are skipped with a reason when the device is not usable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import conftest
from tests.conftest import device_unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


def test_reasons():
    assert device_unavailable_reason(torch.device("cpu")) is None
    assert "only cpu and cuda" in device_unavailable_reason(torch.device("meta"))
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in device_unavailable_reason(torch.device("cuda"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.slow
def test_cuda_without_gpu_skips_device_tests_with_the_reason():
    env = {**os.environ, "TEST_DEVICE": "cuda"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-ra",
            "-p",
            "no:cacheprovider",
            # plugins these five tests do not use: their start-up is most of the run's own CPU
            "-p",
            "no:xdist",
            "-p",
            "no:hypothesispytest",
            "tests/utils/test_distance_matrix.py",
            "tests/test_conftest.py::test_reasons",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TEST_DEVICE=cuda but no CUDA GPU is available" in done.stdout
    assert "1 passed, 3 skipped" in done.stdout  # only the device tests skip


# Test directories that stay on the CPU under TEST_DEVICE=cuda, each with the reason: pipelines
# that choose their device themselves (--device, a config), checked on a GPU by the kit's parts.
HOST_TEST_DIRS = {
    "data": "datasets and splits: host arrays (splits under a meta default device: samplers/)",
    "experiment": "configs and builders; the device comes from the config",
    "reporting": "tables and plots of finished runs",
    "running": "runs in subprocesses with --device (the kit's training and distributed parts)",
}


def test_every_test_directory_is_a_device_directory_or_named_as_host_only():
    dirs = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").is_file()}
    assert dirs == set(conftest.DEVICE_TEST_DIRS) | set(HOST_TEST_DIRS)
    assert not set(conftest.DEVICE_TEST_DIRS) & set(HOST_TEST_DIRS)


def test_a_cpu_generator_draw_in_a_test_lands_on_the_default_device(meta_default_device):
    # meta stands in for CUDA: a plain draw there would follow it without reading the generator
    gen = torch.Generator().manual_seed(0)
    with conftest.CpuDrawsOnTheTestDevice():
        x = torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
        kept = torch.randperm(4, generator=torch.Generator(), device="cpu")
    assert x.device.type == "meta" and x.dtype == torch.float64 and x.shape == (3, 2)
    assert x.is_leaf and x.requires_grad
    assert kept.device.type == "cpu"  # an explicit device is left alone
    # drawn on the CPU: the generator moved on as by a CPU draw of the same six values
    cpu = torch.Generator().manual_seed(0)
    torch.randn(3, 2, generator=cpu, dtype=torch.float64, device="cpu")
    assert torch.equal(gen.get_state(), cpu.get_state())


def test_the_cpu_values_of_a_test_draw_and_no_help_for_package_code():
    want = torch.randn(5, generator=torch.Generator().manual_seed(3))
    with conftest.CpuDrawsOnTheTestDevice():
        got = torch.randn(5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, want)
    # a draw from a file outside tests/ (the package, PML) is not translated
    outside = {}
    source = "import torch\ndef draw(g):\n    return torch.randn(2, generator=g)\n"
    exec(compile(source, "/elsewhere/draw.py", "exec"), outside)
    gen = torch.Generator().manual_seed(0)
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        with conftest.CpuDrawsOnTheTestDevice():
            outside["draw"](gen)
    finally:
        torch.set_default_device(before)
    # a meta draw does not read the CPU generator: untranslated
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(0).get_state())
