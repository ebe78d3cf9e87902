"""Smoke test of ``benchmarks/bench_host_overhead.py`` and unit tests of the host-overhead cuts
of issue 39 (dense label counts, the Ranked List diagonal pairs, ``inverse_or_zero``,
``autocast_off``) against the paths they replace."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
import torch

from pml_rank_plugins.functional import ranked_list_gpu_steps as steps
from pml_rank_plugins.functional.histogram import sync_free
from pml_rank_plugins.functional.sync_free_inputs import autocast_off

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


def test_dense_and_sorted_label_counts_agree(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 5, (23,), generator=generator)
    ref_labels = torch.randint(0, 7, (31,), generator=generator).to(torch.int32)
    for exclude_own, refs in ((False, ref_labels), (True, labels)):
        dense = sync_free.label_counts(labels, refs, exclude_own)
        monkeypatch.setattr(sync_free, "DENSE_COUNT_PAIRS", 0)  # force the sorted path
        sorted_ = sync_free.label_counts(labels, refs, exclude_own)
        monkeypatch.undo()
        for a, b in zip(dense, sorted_):
            assert torch.equal(a, b)
    # against a loop: ref_labels has a class the queries lack, and some queries lack positives
    num_pos, valid, ranked = sync_free.label_counts(labels, ref_labels, False)
    for i, label in enumerate(labels.tolist()):
        same = sum(int(r == label) for r in ref_labels.tolist())
        assert num_pos[i] == same and bool(valid[i]) == (same > 0)
        assert bool(ranked[i]) == (same > 0 and same < len(ref_labels))


def test_ranked_list_diagonal_pairs_equal_explicit_self_columns():
    labels = torch.tensor([0, 0, 1, 1, 2, 0, 1])
    explicit = steps.LabelPairs(labels, labels, torch.arange(len(labels)))
    diagonal = steps.LabelPairs(labels, labels, diagonal=True)
    for start, stop in ((0, 7), (2, 5), (5, 7)):
        for a, b in zip(explicit.candidates(start, stop), diagonal.candidates(start, stop)):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        steps.LabelPairs(labels, labels, torch.arange(7), diagonal=True)


def test_inverse_or_zero_keeps_nan_and_zeroes_empty_rows():
    total = torch.tensor([0.0, 1.0, 4.0, float("nan"), float("inf")], dtype=torch.float64)
    got = steps.inverse_or_zero(total)
    expected = torch.tensor([0.0, 1.0, 0.25, float("nan"), 0.0], dtype=torch.float64)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())


def test_autocast_off_turns_autocast_off_only_where_it_is_on():
    x = torch.randn(4, 4)
    with autocast_off("cpu"):
        assert (x @ x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
        with autocast_off("cpu"):
            assert not torch.is_autocast_enabled("cpu")
            assert (x @ x).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")
