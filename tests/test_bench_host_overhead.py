"""Smoke test of ``benchmarks/bench_host_overhead.py`` (issue 39: host time per call)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_bench_host_overhead_prints_every_case_with_ratios_against_pml(tmp_path):
    import bench_host_overhead

    path = tmp_path / "host.json"
    argv = ["--n", "8", "--repeats", "2", "--rounds", "1", "--warmup", "1", "--json", str(path)]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert bench_host_overhead.main(argv) == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith("| ")][2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    expected = [(loss, b) for loss in ("FastAP", "mAP_Q", "RankedList") for b in ("cpu", "gpu")]
    assert [tuple(row[:2]) for row in cells] == expected + [
        ("PML FastAP", "-"),
        ("PML RankedList", "-"),
    ]
    rows = json.loads(path.read_text())["rows"]
    for row, printed in zip(rows, cells):
        assert row["host_us"] > 0 and row["ops"] > 0
        assert printed[3] == f"{row['pml_over_case']:.2f}x"
        if row["backend"] == "gpu":
            assert row["syncs"] == 0  # the gpu path is sync-free
    assert rows[-1]["pml_over_case"] == pytest.approx(1.0)
