"""``TEST_DEVICE``: device tests are skipped with a reason when the device is not usable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
