"""Smoke test of ``benchmarks/bench_compile.py`` (issue 48: compile time and step time)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_bench_compile_prints_compile_time_step_times_and_the_ratio_against_eager(tmp_path):
    import bench_compile

    path = tmp_path / "compile.json"
    argv = ["--n", "8", "--repeats", "2", "--rounds", "1", "--warmup", "1", "--json", str(path)]
    argv += ["--losses", "RankedList", "--backends", "gpu", "--compilers", "aot_eager"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert bench_compile.main(argv) == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith("| ")][2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert [row[:3] for row in cells] == [["RankedList", "gpu", "aot_eager"]]
    (row,) = json.loads(path.read_text())["rows"]
    assert row["compile_s"] > 0 and row["graphs"] >= 1  # reset before the case: compiled anew
    assert row["eager_over_compiled"] == pytest.approx(row["eager_ms"] / row["compiled_ms"])
    assert cells[0][8] == f"{row['eager_over_compiled']:.2f}x"
    assert row["d_value"] <= 1e-6 and row["d_grad"] <= 1e-6  # the gpu path compiles faithfully


def test_bench_compile_refuses_bad_sizes_and_a_missing_gpu(monkeypatch):
    import bench_compile

    with pytest.raises(SystemExit, match="--n, --dim"):
        bench_compile.main(["--n", "0"])
    monkeypatch.setattr(bench_compile.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        bench_compile.main(["--device", "cuda"])
