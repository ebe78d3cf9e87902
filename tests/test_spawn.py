"""tests/spawn.py: a SIGABRT after both ranks tore down is reported as a warning and the
results are checked; one before that, or any other failure, is raised."""

from __future__ import annotations

import os
import time

import pytest
import torch.multiprocessing as mp

from tests.spawn import spawn_two, torn_down


def _abort_after_teardown(rank: int, prefix: str) -> None:
    torn_down(prefix, rank)
    if rank == 1:
        while not os.path.exists(f"{prefix}.torn_down.0"):  # rank 0 got there too
            time.sleep(0.01)
        os.abort()


def _abort_before_teardown(rank: int, prefix: str) -> None:
    if rank == 1:
        os.abort()
    torn_down(prefix, rank)


def _fail(rank: int, prefix: str) -> None:
    torn_down(prefix, rank)
    if rank == 0:
        raise RuntimeError("rank 0 failed")


def test_abort_after_both_tore_down_is_a_warning(tmp_path):
    prefix = str(tmp_path / "run")
    with pytest.warns(RuntimeWarning, match="rank 1 was killed by SIGABRT after both ranks"):
        spawn_two(_abort_after_teardown, (prefix,), prefix)


def test_abort_before_teardown_is_raised(tmp_path):
    prefix = str(tmp_path / "run")
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawn_two(_abort_before_teardown, (prefix,), prefix)


def test_a_failing_rank_is_raised_even_after_teardown(tmp_path):
    prefix = str(tmp_path / "run")
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 failed"):
        spawn_two(_fail, (prefix,), prefix)
