"""The benchmark scripts run end to end (tiny sizes; no timing is asserted) and their shared
measurement helpers keep best times and largest peaks.

The scripts run with ``--smoke`` (every case once, in the script's own process: one interpreter
start per script instead of one or two per case and round), as ``__main__`` in this test process
(:func:`smoke`: torch, PML and the package are imported here already); ``bench_distributed.py``
(its smoke run forks its ranks) runs as its own process, and one test runs the normal
subprocess-per-case path as the scripts' users do. :func:`measure_in_child` is checked directly
in both modes. Runs with the same arguments are shared within a test process: one run of each
pairwise script (two sizes, under a competing load) serves every test that reads its table, and
``make test`` (``--dist loadfile``: one worker per module) runs it once."""

import argparse
import contextlib
import functools
import gc
import io
import os
import re
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from _measure import (  # noqa: E402
    LOW_MMAP_THRESHOLD,
    SMOKE_NOTE,
    best_over_rounds,
    competing_load,
    machine_load,
    measure_in_child,
    run_json,
    time_calls,
)
from bench_memory_bank import paired_times  # noqa: E402


def run_script(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@functools.cache
def smoke(name: str, *args: str) -> str:
    """``python benchmarks/name *args --smoke``'s output, the script run as ``__main__`` in this
    process (``runpy``); a second call with the same arguments reuses it.

    What a script changes in its process is restored: ``sys.argv``, torch's thread count
    (``--threads``) and random state, and the objects ``_measure.collect_garbage`` froze (a
    collection then frees the script's last case, DataLoader workers included). A script that
    fails raises here, or exits with a non-zero status (``pytest.fail`` with it)."""
    script = BENCHMARKS / name
    saved = sys.argv, torch.get_num_threads(), torch.random.get_rng_state()
    sys.argv = [str(script), *args, "--smoke"]
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exited:  # `sys.exit(main())`: None when it ran through
        if exited.code not in (None, 0):
            pytest.fail(f"{name} {' '.join(args)} --smoke exited with {exited.code!r}")
    finally:
        sys.argv = saved[0]
        torch.set_num_threads(saved[1])
        torch.random.set_rng_state(saved[2])
        gc.unfreeze()
        gc.collect()
    assert out.getvalue().startswith(SMOKE_NOTE)
    return out.getvalue()


def table_rows(output: str) -> list[list[str]]:
    rows = [line.strip("|").split("|") for line in output.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row] for row in rows]
    return [row for row in cells if row[0] not in ("N", "case") and not row[0].startswith("---")]


# One smoke run per pairwise script, read by the tests of its xdist group: two sizes (PML skipped
# at the second) under a competing load.
PAIRWISE_SMOKE = {
    "bench_histogram_ap.py": ("--sizes", "32", "48", "--pml-max", "32", "--load", "train"),
    "bench_ranked_list.py": ("--sizes", "32", "48", "--pml-max", "32", "--load", "spawn"),
}
HISTOGRAM_AP_SMOKE = ("bench_histogram_ap.py", *PAIRWISE_SMOKE["bench_histogram_ap.py"])
RANKED_LIST_SMOKE = ("bench_ranked_list.py", *PAIRWISE_SMOKE["bench_ranked_list.py"])
HISTOGRAM_AP_GROUP = pytest.mark.xdist_group("bench_histogram_ap_smoke")
RANKED_LIST_GROUP = pytest.mark.xdist_group("bench_ranked_list_smoke")


@pytest.mark.slow
@HISTOGRAM_AP_GROUP
def test_bench_histogram_ap_prints_one_row_per_size():
    out = smoke(*HISTOGRAM_AP_SMOKE)
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["32", "48"]
    assert rows[0][4].endswith("x") and rows[1][2] == "skipped"
    assert "PML skipped above N=32" in out


@pytest.mark.parametrize(
    "script, load, name",
    [
        pytest.param(
            "bench_histogram_ap.py",
            "train",
            "one-thread training process",
            marks=HISTOGRAM_AP_GROUP,
        ),
        pytest.param(
            "bench_ranked_list.py",
            "spawn",
            "niced loop starting short Python processes",
            marks=RANKED_LIST_GROUP,
        ),
    ],
)
@pytest.mark.slow
def test_bench_under_a_competing_load_names_it_and_stops_it(script, load, name):
    args = PAIRWISE_SMOKE[script]
    assert args[args.index("--load") + 1] == load
    out = smoke(script, *args)
    assert [row[0] for row in table_rows(out)] == ["32", "48"]
    assert f"competing load: a {name}" in out
    assert "before: load average" in out and "after: load average" in out


@pytest.mark.slow
@HISTOGRAM_AP_GROUP
def test_bench_histogram_ap_reports_map_q_next_to_fastap():
    # The normal path (no --smoke): each case measured in its own --child subprocess.
    out = run_script(
        "bench_histogram_ap.py",
        *("--sizes", "32", "--warmup", "0", "--repeats", "1", "--rounds", "1"),
    )
    assert SMOKE_NOTE not in out
    header = next(line for line in out.splitlines() if line.startswith("| N "))
    assert "mAP_Q s" in header and "PML / mAP_Q" in header
    row = table_rows(out)[0]
    assert row[-2].endswith("x")  # mAP_Q / floor
    # the smoke run prints the same table: same header, same cells filled
    smoke_out = smoke(*HISTOGRAM_AP_SMOKE)
    assert header in smoke_out.splitlines()
    shape = [re.sub(r"[\d.]+", "9", cell) for cell in row]  # "9x", "9/9", "9", "skipped"...
    assert [re.sub(r"[\d.]+", "9", cell) for cell in table_rows(smoke_out)[0]] == shape
    assert "skipped" not in shape and "-" not in shape and "error" not in shape


def write_child_script(path: Path) -> Path:
    """A stand-in benchmark child: prints ``{"time": its repeats, "peak": MALLOC_MMAP_THRESHOLD_ or
    -1, "argv": its arguments}`` as JSON."""
    path.write_text(
        "import json, os, sys\n"
        "print(json.dumps({'time': float(sys.argv[-2]), "
        "'peak': int(os.environ.get('MALLOC_MMAP_THRESHOLD_', -1)), 'argv': sys.argv[1:]}))\n"
    )
    return path


def test_measure_in_child_times_one_child_and_takes_the_peak_from_a_second(tmp_path):
    script = write_child_script(tmp_path / "child.py")
    args = argparse.Namespace(warmup=3, repeats=7, rounds=1, threads=2)
    one = measure_in_child(str(script), "case", [5, 6], args)
    assert one == {"time": 7.0, "peak": -1, "argv": ["--child", "case", "5", "6", "3", "7", "2"]}
    two = measure_in_child(str(script), "case", [5], args, memory_pass=True)
    # time from the timing child (default allocator), peak from the memory child (0 warm-up)
    assert two == {"time": 7.0, "peak": int(LOW_MMAP_THRESHOLD["MALLOC_MMAP_THRESHOLD_"])}


@pytest.fixture
def gc_unfrozen_after() -> Iterator[None]:
    """``gc.unfreeze()`` after the test: a smoke or in-process measurement freezes this process's
    objects (``_measure.collect_garbage``)."""
    yield
    gc.unfreeze()


def test_smoke_measures_each_case_once_in_this_process_with_its_own_peak(gc_unfrozen_after):
    calls = []

    def run_case(case, size, warmup, repeats, threads):
        calls.append((case, os.getpid(), size, warmup, repeats, threads))
        # a block of ``size`` bytes written in the timed call: the case's own peak
        return time_calls(lambda: torch.ones(size, dtype=torch.uint8).sum(), warmup, repeats)

    args = argparse.Namespace(warmup=0, repeats=1, rounds=1, threads=1, smoke=True)
    args.run_case = run_case
    big = measure_in_child("never-run.py", "big", [64 * 2**20], args, memory_pass=True)
    small = measure_in_child("never-run.py", "small", [2**20], args, memory_pass=True)
    assert calls == [
        ("big", os.getpid(), 64 * 2**20, 0, 1, 1),
        ("small", os.getpid(), 2**20, 0, 1, 1),
    ]
    assert big["time"] >= 0 and big["peak"] >= 32 * 2**20
    # the peak was reset between the cases: the small case does not inherit the big one's
    assert small["peak"] < 16 * 2**20

    def broken(*numbers):
        raise ZeroDivisionError("a broken case")

    args.run_case = broken
    with pytest.raises(ZeroDivisionError, match="a broken case"):  # not recorded as an error row
        measure_in_child("never-run.py", "broken", [1], args)


def running_commands() -> str:
    """Every process's whole command line, one per line.

    ``ps -eo args`` cuts lines at the terminal's width (it did on CI, where the checkout's path
    is longer); ``-ww`` asks for unlimited width.
    """
    return subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout


def test_competing_load_runs_during_the_block_only():
    with competing_load("train", limit_s=61.25, settle_s=0.5):
        assert "_load.py train 61.25" in running_commands()
    assert "_load.py train 61.25" not in running_commands()
    with pytest.raises(ValueError, match="unknown load 'busy'"):
        with competing_load("busy"):
            pass
    assert machine_load().startswith("load average ")


@pytest.mark.slow
def test_bench_chunked_with_loader_workers_names_the_data_loader():
    out = smoke("bench_chunked.py", "--batch", "16", "--chunk", "8", "--loader-workers", "2")
    assert [row[0] for row in table_rows(out)] == ["chunked", "plain small", "plain large"]
    assert "DataLoader with 2 worker processes" in out


@pytest.mark.slow
def test_bench_chunked_prints_the_three_cases_and_ratios():
    out = smoke("bench_chunked.py", "--batch", "32", "--chunk", "8")
    assert [row[0] for row in table_rows(out)] == ["chunked", "plain small", "plain large"]
    assert "chunked time / plain large time:" in out


@pytest.mark.slow
@RANKED_LIST_GROUP
def test_bench_ranked_list_prints_one_row_per_size():
    out = smoke(*RANKED_LIST_SMOKE)
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["32", "48"]
    assert rows[0][5].endswith("x") and rows[1][3] == "skipped"
    assert "PML skipped above N=32" in out


def test_bench_memory_bank_toy_size_prints_every_case():
    out = smoke(
        "bench_memory_bank.py",
        *("--memory", "64", "--batch", "8", "--dim", "8", "--device", "cpu", "--paired"),
    )
    all_rows = table_rows(out)
    rows, paired = all_rows[:10], all_rows[10:]
    losses = ["fastap", "qap", "rll"]
    assert [row[0] for row in rows] == [
        "floor",
        *losses,
        *(f"{name}_ref" for name in losses),
        *(f"{name}_pml" for name in losses),
    ]
    assert all(row[2].endswith("x") for row in rows)
    # Memory-bank rows are compared with the direct ref_emb call, in time and peak memory.
    by_case = {row[0]: row for row in rows}
    for case in [*losses, *(f"{name}_pml" for name in losses)]:
        assert by_case[case][3].endswith("x") and by_case[case][5].endswith("x")
    assert by_case["fastap_ref"][3] == "-"
    assert "CPU, 2 threads" in out
    # --paired: one row per loss, CrossBatchMemory against the floor and the direct call.
    assert [row[0] for row in paired] == ["loss", *losses]
    assert all(row[5].endswith("x") and row[6].endswith("x") for row in paired[1:])


def test_paired_times_rotate_the_order_so_each_case_is_timed_in_each_position():
    x = torch.zeros(2, requires_grad=True)
    calls = []

    def case(name):
        def compute():
            calls.append(name)
            return x.sum()

        return compute

    names = ["floor", "rll", "rll_ref", "rll_pml"]
    best = paired_times(x, {name: case(name) for name in names}, warmup=1, repeats=8)
    assert sorted(best) == sorted(names) and all(t > 0 for t in best.values())
    rounds = [calls[i : i + 4] for i in range(0, len(calls), 4)]
    assert len(rounds) == 9 and sorted(rounds[0]) == sorted(names)  # one warm-up round
    timed = rounds[1:]
    assert timed[0] == names and timed[1] == ["rll", "rll_ref", "rll_pml", "floor"]
    for position in range(4):  # every case twice in every position over the 8 timed rounds
        assert sorted(r[position] for r in timed) == sorted(names * 2)


def test_bench_memory_bank_cuda_runs_on_a_gpu_or_says_there_is_none(monkeypatch):
    args = ["--memory", "64", "--batch", "8", "--dim", "8", "--device", "cuda", "--smoke"]
    if torch.cuda.is_available():  # the CUDA timing branch at toy size
        rows = table_rows(run_script("bench_memory_bank.py", *args))
        assert len(rows) == 10 and all(row[2].endswith("x") for row in rows)
        return
    # No GPU: the script run as __main__ in this process (its modules are imported already); a
    # SystemExit with a message is what makes `python script` print it to stderr and exit 1.
    script = BENCHMARKS / "bench_memory_bank.py"
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    message = exited.value.code
    assert isinstance(message, str)  # not None or 0: the exit status is 1
    assert "--device cuda, but no CUDA GPU is available" in message


def test_best_over_rounds_keeps_best_time_and_largest_peak():
    results = iter(
        [
            {"time": 2.0, "peak": 5},
            {"time": 1.0, "peak": 1},
            {"time": 1.5, "peak": 9},
            {"time": 3.0, "peak": 0},
        ]
    )
    calls = []

    def measure(case):
        calls.append(case)
        return next(results)

    best = best_over_rounds(measure, ["a", "b"], rounds=2)
    assert calls == ["a", "b", "a", "b"]  # interleaved
    assert best == {"a": {"time": 1.5, "peak": 9}, "b": {"time": 1.0, "peak": 1}}


def test_time_calls_runs_warmup_and_repeats():
    calls = []
    result = time_calls(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5
    assert result["time"] >= 0 and result["peak"] >= 0
    with pytest.raises(ValueError, match="repeats"):
        time_calls(lambda: None, warmup=0, repeats=0)


def test_run_json_reports_a_failing_child():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_json(["-c", "1 / 0"])
    assert run_json(["-c", "print('noise'); print('{\"a\": 1}')"]) == {"a": 1}


@pytest.mark.slow  # 2 of the 4 cases spawn 2 gloo processes (about 15 s of CPU)
def test_bench_distributed_prints_four_cases_and_ratios():
    # its own process: the smoke run forks the 2-process cases' ranks (see bench_distributed.py)
    out = run_script("bench_distributed.py", "--batch", "16", "--chunk", "4", "--smoke")
    assert out.startswith(SMOKE_NOTE)
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["plain R=1", "plain R=2", "chunked R=1", "chunked R=2"]
    assert [row[2] for row in rows] == ["16", "8", "16", "8"]
    assert "plain: 2-process / 1-process time" in out and "chunked: 2-process" in out
