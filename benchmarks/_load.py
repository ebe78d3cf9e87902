"""A competing CPU load for the benchmarks' ``--load`` option (started and stopped by
:func:`_measure.competing_load`; it also stops by itself after ``SECONDS``).

* ``train`` -- a one-thread training loop (a small MLP, SGD): one core kept busy, as a second
  training job or a DataLoader worker does;
* ``spawn`` -- a niced loop that starts one short Python process after another (each imports a
  few standard modules and exits), as config fuzzing or a test runner does: bursts of process
  start-up on any core, with the scheduler migrating work all the time.

Run: ``python benchmarks/_load.py train|spawn SECONDS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

SHORT_PROCESS = "import argparse, email.parser, json, logging"


def train(deadline: float) -> None:
    """A one-thread MLP training loop until ``deadline`` (``time.monotonic()``)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 256)
    while time.monotonic() < deadline:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()


def spawn(deadline: float) -> None:
    """Short Python processes, one after another, at nice 10, until ``deadline``."""
    os.nice(10)
    while time.monotonic() < deadline:
        subprocess.run([sys.executable, "-c", SHORT_PROCESS], check=True)


LOADS = {"train": train, "spawn": spawn}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in LOADS:
        sys.exit(f"usage: _load.py {'|'.join(LOADS)} SECONDS (got {sys.argv[1:]})")
    LOADS[sys.argv[1]](time.monotonic() + float(sys.argv[2]))


if __name__ == "__main__":
    main()
