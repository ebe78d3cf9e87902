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
import json
import os
import re
import runpy
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from _backends import (  # noqa: E402
    COUNT_ENV,
    DEADLINE_ENV,
    GUARD_ENV,
    MARKER,
    NEEDS_CUDA,
    CaseSkipped,
    backend_list,
    backend_variants,
    classify_profile,
    count_ops,
    flatten,
    guarded_first_calls,
    int_list,
    pml_bytes,
    pml_skip_reason,
    split_graph,
)
from _measure import (  # noqa: E402
    LOW_MMAP_THRESHOLD,
    SMOKE_NOTE,
    best_over_rounds,
    competing_load,
    machine_load,
    measure_in_child,
    measure_in_process,
    print_failures,
    run_case_safely,
    run_json,
    run_pairwise_case,
    time_calls,
)
from bench_memory_bank import paired_times  # noqa: E402

SETTING_VARIABLES = (COUNT_ENV, DEADLINE_ENV, GUARD_ENV)


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
    (``--threads``) and random state, the per-case settings it put in the environment
    (``_backends.apply_settings``), and the objects ``_measure.collect_garbage`` froze (a
    collection then frees the script's last case, DataLoader workers included). A script that
    fails raises here, or exits with a non-zero status (``pytest.fail`` with it)."""
    script = BENCHMARKS / name
    saved = sys.argv, torch.get_num_threads(), torch.random.get_rng_state()
    saved_env = {key: os.environ.get(key) for key in SETTING_VARIABLES}
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
        for key, value in saved_env.items():  # --time-guard, --budget-s, counting
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gc.unfreeze()
        gc.collect()
    assert out.getvalue().startswith(SMOKE_NOTE)
    return out.getvalue()


def table_rows(output: str) -> list[list[str]]:
    """The body rows of every Markdown table in ``output`` (headers and rules left out)."""
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    is_rule = [row[0].startswith("---") for row in rows]
    header = [i + 1 < len(rows) and is_rule[i + 1] for i in range(len(rows))]
    return [row for i, row in enumerate(rows) if not is_rule[i] and not header[i]]


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


def test_bench_ranked_list_backend_runs_ours_on_that_backend(monkeypatch):
    # --backend NAME: ours and ours gg under use_backend(NAME), beside PML and the floor of the
    # same run (the CPU default is the cpu backend, so every gpu kernel call comes from it).
    from pml_rank_plugins.utils import ranked_list_backends

    calls = []
    real = ranked_list_backends.gpu_ranked_list_terms
    monkeypatch.setattr(
        ranked_list_backends,
        "gpu_ranked_list_terms",
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )
    out = smoke("bench_ranked_list.py", "--sizes", "32", "--pml-max", "32", "--backend", "gpu")
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["32"]
    assert rows[0][5].endswith("x") and rows[0][7].endswith("x")  # PML / ours, ours / floor
    assert "ours and gg on backend gpu" in out and len(calls) >= 2


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
    assert [row[0] for row in paired] == losses
    assert all(row[5].endswith("x") and row[6].endswith("x") for row in paired)


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


# -- issue 39: --backends, the op-count proxy, the training step, the GPU script ------------------
BACKENDS_SMOKE = ("--sizes", "32,48", "--pml-max", "32", "--backends", "cpu,gpu", "--cuda-graph")


def by_key(rows: list[list[str]], *columns: int) -> dict:
    """The rows keyed by the cells at ``columns`` (e.g. N, case, backend)."""
    return {tuple(row[c] for c in columns): row for row in rows}


def test_bench_histogram_ap_backends_rows_with_pml_floor_and_counts():
    out = smoke("bench_histogram_ap.py", *BACKENDS_SMOKE)
    header = next(line for line in out.splitlines() if line.startswith("| N "))
    assert "| backend |" in header and "aten ops | sync ops" in header
    rows = by_key(table_rows(out), 0, 1, 2)
    expected = [("floor", "-"), ("PML FastAP", "-")]
    expected += [(loss, b) for loss in ("FastAP", "mAP_Q") for b in ("cpu", "gpu", "gpu+graph")]
    assert list(rows) == [(n, *key) for n in ("32", "48") for key in expected]  # 32,48 parsed
    for n in ("32", "48"):  # --cuda-graph: a graphed twin of gpu (not of cpu), skipped here
        for loss, case in (("FastAP", "ours"), ("mAP_Q", "qap")):
            assert rows[(n, loss, "gpu+graph")][3:] == ["skipped", "-", "-", "-", "-", "-", "-"]
            assert f"N={n} {case}@gpu+graph: skipped: needs CUDA" in out
    for n in ("32", "48"):
        floor = rows[(n, "floor", "-")]
        assert floor[5] == "1.00x" and floor[-1] == "0"  # S = X X^T syncs nothing
        for loss in ("FastAP", "mAP_Q"):
            for backend in ("cpu", "gpu"):
                row = rows[(n, loss, backend)]
                assert float(row[3]) > 0 and row[5].endswith("x")
                assert int(row[-2]) > 0 and int(row[-1]) >= 0  # aten ops, sync ops counted
                assert row[4].endswith("x") == (n == "32")  # vs PML only where PML ran
    assert int(rows[("32", "PML FastAP", "-")][-2]) > 0
    assert rows[("48", "PML FastAP", "-")][3] == "skipped"
    assert "N=48 pml: skipped: above --pml-max 32" in out


def test_bench_ranked_list_backends_skips_the_cpu_backend_above_its_max():
    out = smoke("bench_ranked_list.py", *BACKENDS_SMOKE, "--cpu-backend-max", "32")
    rows = by_key(table_rows(out), 0, 1, 2)
    assert rows[("32", "RankedList", "cpu")][3] != "skipped"
    assert rows[("48", "RankedList", "cpu")][3] == "skipped"
    assert float(rows[("48", "RankedList", "gpu")][3]) > 0
    assert "N=48 ours@cpu: skipped: cpu backend above --cpu-backend-max 32" in out
    assert rows[("48", "RankedList", "gpu+graph")][3] == "skipped"
    assert "N=48 ours@gpu+graph: skipped: needs CUDA" in out


def test_bench_memory_bank_backends_compares_each_case_with_its_own_backends_ref():
    out = smoke(
        "bench_memory_bank.py",
        *("--memory", "64", "--batch", "8", "--dim", "8", "--device", "cpu"),
        *("--backends", "gpu"),
    )
    rows = by_key(table_rows(out), 0, 1)
    losses = ["fastap", "qap", "rll"]
    cases = [*losses, *(f"{x}_ref" for x in losses), *(f"{x}_pml" for x in losses)]
    assert list(rows) == [("floor", "-"), *((case, "gpu") for case in cases)]
    for case in cases:
        row = rows[(case, "gpu")]
        assert row[3].endswith("x") and int(row[-2]) > 0  # vs floor; aten ops
        assert row[4] == "-" if case.endswith("_ref") else row[4].endswith("x")


def test_cuda_graph_rows_follow_each_backend_but_cpu_and_need_cuda():
    assert backend_variants(["cpu", "gpu", "triton"], cuda_graph=False) == ["cpu", "gpu", "triton"]
    graphed = backend_variants(["cpu", "gpu", "triton"], cuda_graph=True)
    assert graphed == ["cpu", "gpu", "gpu+graph", "triton", "triton+graph"]
    assert split_graph("triton+graph") == ("triton", True) and split_graph("gpu") == ("gpu", False)
    assert split_graph(None) == (None, False)
    # A graphed case that reaches a CPU child (by hand: the table skips it before) is skipped
    # with the reason, before any input is made.
    result = run_case_safely(
        lambda *a: run_pairwise_case(pytest.fail, *a), "ours@gpu+graph", [8, 4, 0, 0, 0, 1, 1]
    )
    assert result == {"time": None, "peak": None, "skipped": NEEDS_CUDA}


def test_time_guard_skips_a_slow_case_but_gives_a_slow_first_call_a_second_try():
    def step_taking(*durations):
        left = list(durations)
        return lambda: time.sleep(left.pop(0))

    assert guarded_first_calls(step_taking(0.0), False, None) == []  # no guard: no extra call
    assert len(guarded_first_calls(step_taking(0.0), False, 0.05)) == 1
    compiled = guarded_first_calls(step_taking(0.08, 0.0), False, 0.05)  # a compile, then fast
    assert len(compiled) == 2 and compiled[0] >= 0.08 and compiled[1] < 0.05
    with pytest.raises(CaseSkipped, match="over --time-guard 0.05 s"):
        guarded_first_calls(step_taking(0.08, 0.08), False, 0.05)


def test_budget_run_out_skips_a_case_and_a_skip_never_replaces_a_measurement(
    monkeypatch, gc_unfrozen_after
):
    import bench_histogram_ap
    from _measure import run_pairwise_case

    case = functools.partial(run_pairwise_case, bench_histogram_ap.make_loss)
    args = argparse.Namespace(warmup=0, repeats=1, rounds=1, threads=1, in_process=True)
    args.run_case = case
    monkeypatch.setenv(DEADLINE_ENV, repr(time.time() - 1))
    skipped = measure_in_child("never-run.py", "ours@gpu", [8, 4, 0, 0], args)
    assert skipped == {"time": None, "peak": None, "skipped": "out of the time budget (--budget-s)"}
    monkeypatch.delenv(DEADLINE_ENV)
    measured = measure_in_child("never-run.py", "ours@gpu", [8, 4, 0, 0], args)
    assert measured["time"] > 0
    results = iter([measured, skipped])
    best = best_over_rounds(lambda c: dict(next(results)), ["a"], rounds=2)
    assert best["a"]["time"] == measured["time"]


def test_failed_in_process_case_keeps_its_traceback_and_the_table_prints_it(capsys):
    def broken(case, *numbers):
        return {"x": 1}[case]  # KeyError deep in a case

    result = measure_in_process(broken, "ours", [1])
    assert result["error"] == "KeyError: 'ours'"
    assert "Traceback" in result["traceback"] and 'return {"x": 1}[case]' in result["traceback"]
    print_failures([{"n": 8, "cases": {"ours": result, "pml": {"skipped": "too big"}}}])
    out = capsys.readouterr().out
    assert "N=8 ours: KeyError: 'ours'\n```\nTraceback" in out
    assert "N=8 pml: skipped: too big" in out


def test_sizes_take_commas_and_spaces():
    assert flatten([int_list("256,1024"), int_list("4096")]) == [256, 1024, 4096]
    with pytest.raises(ValueError, match="integers separated by commas"):
        int_list("256,1k")
    assert backend_list("cpu, GPU,cpu") == ["cpu", "gpu"]
    with pytest.raises(ValueError, match="cpu, gpu, triton, auto"):
        backend_list("cuda")


def test_pml_memory_model_matches_the_issue_measurements_and_names_the_need():
    # issue 39, one H200: PML FastAP 2.9 GB at N = 4096, 47 GB at 16384; RankedList 12.5 GB
    for loss, n, measured in [
        ("fastap", 4096, 2.9e9),
        ("fastap", 16384, 47e9),
        ("ranked_list", 16384, 12.5e9),
    ]:
        assert abs(pml_bytes(loss, n) / measured - 1) < 0.1
    assert pml_skip_reason("fastap", 256, "cpu") is None
    reason = pml_skip_reason("fastap", 65536, "cpu")
    assert reason.startswith("would need 756 GB")


def test_profile_classification_counts_kernels_syncs_inside_the_call_and_dtoh_copies():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, start=5.0, end=6.0):
        return SimpleNamespace(
            name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end)
        )

    events = [
        event(MARKER, cpu, 0.0, 10.0),
        event(MARKER, cuda),  # the marker's annotation on the device: not a kernel
        event("void at::native::vectorized_elementwise_kernel<...>", cuda),
        event("ampere_sgemm_128x64_nn", cuda),
        event("Memcpy DtoH (Device -> Pageable)", cuda),
        event("Memcpy HtoD (Pageable -> Device)", cuda),
        event("Memset (Device)", cuda),
        event("cudaLaunchKernel", cpu),
        event("cudaStreamSynchronize", cpu, 3.0, 4.0),
        event("cudaDeviceSynchronize", cpu, 11.0, 12.0),  # after the call: the profiler's own
    ]
    counts = classify_profile(events)
    assert counts == {
        "kernels": 2,
        "syncs": 1,
        "dtoh": 1,
        "copies": 2,
        "sync_calls": {"cudaStreamSynchronize": 1},
    }
    # the attributes read exist on a real trace's events (a CPU-only trace: nothing on a device)
    x = torch.ones(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(MARKER):
            (x @ x).sum()
    assert any(e.name == MARKER for e in prof.events())
    assert classify_profile(prof.events())["kernels"] == 0


def test_count_ops_flags_a_syncing_operator():
    x = torch.tensor([0.0, 1.0, 2.0])
    counts = count_ops(lambda: x[x > 0].sum())  # boolean indexing: a nonzero in disguise
    assert counts["aten_ops"] >= 3 and counts["sync_ops"] >= 1
    assert count_ops(lambda: (x * 2).sum())["sync_ops"] == 0


def run_main(module, argv: list[str]) -> tuple[int, str]:
    """``module.main(argv)`` in this process: its return code and what it printed."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = module.main(argv)
    return code, out.getvalue()


def test_op_counts_prints_every_loss_and_backend_with_targets(tmp_path):
    import op_counts

    path = tmp_path / "counts.json"
    code, out = run_main(op_counts, ["--n", "48", "--pml-n", "32", "--json", str(path)])
    assert code == 0  # whatever the verdicts, without --check
    rows = by_key(table_rows(out), 0, 1)
    ours = [(loss, b) for loss in ("FastAP", "mAP_Q", "RankedList") for b in ("cpu", "gpu")]
    assert list(rows) == [*ours, ("PML FastAP", "-"), ("PML RankedList", "-")]
    for key in ours:
        assert rows[key][2] == "48" and int(rows[key][3]) > 0
        assert rows[key][7] == ("-" if key[1] == "cpu" else rows[key][7])
        assert rows[key][7] in (("-",) if key[1] == "cpu" else ("PASS", "FAIL"))
    assert rows[("FastAP", "gpu")][6].startswith("0 syncs, <= 100 ops, < PML (")
    assert rows[("RankedList", "gpu")][6].startswith("0 syncs, <= 140 ops")
    assert rows[("PML FastAP", "-")][2] == "32"
    saved = json.loads(path.read_text())
    misses = sum(row["verdict"] == "FAIL" for row in saved["rows"])
    assert saved["misses"] == misses
    code, _ = run_main(op_counts, ["--n", "48", "--pml-n", "32", "--check"])
    assert code == (1 if misses else 0)


def test_op_counts_verdict_and_pml_count_independent_of_n():
    import op_counts

    pml = {"ops": 150}
    assert op_counts.verdict("FastAP", "gpu", {"ops": 99, "syncs": 0}, pml)[1] == "PASS"
    assert op_counts.verdict("FastAP", "gpu", {"ops": 101, "syncs": 0}, pml)[1] == "FAIL"
    assert op_counts.verdict("FastAP", "gpu", {"ops": 90, "syncs": 1}, pml)[1] == "FAIL"
    assert op_counts.verdict("RankedList", "triton", {"ops": 140, "syncs": 0}, pml)[1] == "PASS"
    assert op_counts.verdict("RankedList", "gpu", {"ops": 140, "syncs": 0}, {"ops": 140})[1] == (
        "FAIL"
    )
    assert op_counts.verdict("FastAP", "cpu", {"ops": 999, "syncs": 9}, pml)[1] == "-"
    # PML is counted at a smaller N than ours on the grounds that its count does not depend on N
    for name in ("PML FastAP", "PML RankedList"):
        loss = op_counts.make_loss(name, None)
        small, large = (op_counts.count(loss, n, 16, "cpu", None) for n in (32, 96))
        assert small["ops"] == large["ops"] > 0


@pytest.mark.slow  # six training steps of a ResNet-18 on the CPU (about 5 s of CPU idle)
def test_bench_train_step_toy_size_prints_every_case(tmp_path):
    import bench_train_step

    path = tmp_path / "train_step.json"
    argv = ["--device", "cpu", "--arch", "resnet18", "--image-size", "16", "--batch", "8"]
    argv += ["--steps", "1", "--warmup", "0", "--threads", "1", "--json", str(path)]
    saved = torch.get_num_threads()
    try:
        code, out = run_main(bench_train_step, argv)
    finally:
        torch.set_num_threads(saved)
    assert code == 0
    assert "autocast none" in out  # auto: float32 on the CPU
    rows = table_rows(out)
    labels = ["trunk only", "plugin FastAP", "plugin RankedList"]
    labels += ["PML FastAPLoss", "PML RankedListLoss", "PML ContrastiveLoss"]
    assert [row[0] for row in rows] == labels
    for row in rows:
        assert float(row[2]) > 0 and float(row[3]) > 0 and row[4].endswith("%")
    assert rows[0][5] == "-" and all(re.fullmatch(r"-?[\d.]+", row[5]) for row in rows[1:])
    results = json.loads(path.read_text())["results"]
    assert [r["label"] for r in results] == labels
    assert all(0 < r["share"] and r["loss_s"] > 0 for r in results)


@pytest.mark.slow  # five Python processes (op counts, three benchmarks, the training step)
def test_gpu_bench_tiny_runs_every_part_and_writes_its_files(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    script = BENCHMARKS.parent / "scripts" / "gpu_bench.sh"
    done = subprocess.run(
        [str(script), "--tiny", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files = ["bench.json", "bench.md", "env.txt", "train_step.json", "train_step.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    env_txt = (tmp_path / "env.txt").read_text()
    for key in ("date:", "torch:", "device:", "triton:", "pytorch_metric_learning:"):
        assert key in env_txt
    bench = (tmp_path / "bench.md").read_text()
    for part in ("op counts", "FastAP / mAP_Q", "RankedList", "memory bank"):
        assert re.search(rf"-- {re.escape(part)}.*: exit 0 after", bench), part
    assert "Traceback" not in bench
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert sorted(merged) == [
        "bench_histogram_ap",
        "bench_memory_bank",
        "bench_ranked_list",
        "op_counts",
    ]
    assert merged["bench_histogram_ap"]["backends"] == ["cpu", "gpu"]
    assert merged["bench_memory_bank"]["backends"] == ["gpu", "cpu"]  # tiny: no triton on a CPU
    train = (tmp_path / "train_step.md").read_text()
    assert "-- training step: exit 0" in train and "| PML ContrastiveLoss |" in train


def test_gpu_bench_runs_the_memory_bank_on_gpu_and_triton_by_default():
    # issue 49, item 5: batch 256 against 65,536 on gpu and triton in the default parts (first,
    # so that a budget running out cuts the cpu backend's rows)
    script = (BENCHMARKS.parent / "scripts" / "gpu_bench.sh").read_text()
    default_parts = re.search(r"GPU_BENCH_PARTS:-([a-z ]+)\}", script).group(1).split()
    assert "bank" in default_parts
    full = re.search(r"device=cuda backends=\S+ bank_backends=(\S+)", script)
    assert full.group(1).split(",")[:2] == ["gpu", "triton"]
    assert "memory=(--memory 65536 --batch 256 --dim 128)" in script
    assert re.search(r"want bank && run .*bench_memory_bank\.py", script)
