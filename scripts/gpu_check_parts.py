"""The light parts of ``scripts/gpu_check.py`` and the frame every part runs in.

``python scripts/gpu_check_parts.py PART --device cuda|cpu [--tiny] --out DIR [--budget S]``
writes ``DIR/result.json``: ``{"status": "pass" | "fail" | "skipped", "reason": str | None,
"details": {...}, "markdown": [lines]}`` (:func:`part_main`). Parts here: ``environment``,
``tests``, ``benchmarks``, ``training``; ``distributed`` is in ``gpu_check_dist.py`` and ``knn`` in
``gpu_check_knn.py`` (they import the package's heavier modules, which these parts do not
need). With ``--tiny`` the benchmark scripts and pytest run in the part's own process
(``gpu_check_here.py``); otherwise each gets a fresh process, as its timings need. A part that
needs CUDA is ``skipped`` with ``--device cpu`` and fails with ``--device cuda`` when no GPU is
usable.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytorch_metric_learning
import torch
from gpu_check_deps import check_dependencies, faiss_route, missing
from gpu_check_here import run_here, run_script_here
from gpu_check_pytest import failure_groups, group_lines, parse_pytest, tail

import pml_rank_plugins

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "no CUDA device (--device cpu)"
GIB = 2**30
# Targets of issue 31 (one GPU, float32): (case, what, bound)
SPEED_TARGETS = {"FastAP": 10.0, "mAP_Q": 10.0, "RankedList": 5.0}
FLOOR_TARGET = 1.5
MEMORY_TARGET_GIB = 8.0
# --tiny: one quick file from the device test directories
TINY_TESTS = ["tests/utils/test_pair_masks.py"]
# the tests part's targets instead of the device directories (gpu_check.py --tests): paths
# separated by os.pathsep
TESTS_ENV = "GPU_CHECK_TESTS"
PYTEST_LOG = "pytest.txt"  # the whole pytest output, in the part's folder (and OUT/logs/)


def cuda_refusal(device: str) -> str | None:
    """Why a CUDA-only part cannot run: ``NO_CUDA`` with ``--device cpu`` (a skip); raises with
    ``--device cuda`` and no usable GPU (a failure)."""
    if device == "cpu":
        return NO_CUDA
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch.cuda.is_available() is False")
    return None


def python_path() -> str:
    """The repository first on ``PYTHONPATH``, then the caller's own entries (kept, not
    replaced: a user's path or a ``pip install --target`` folder)."""
    entries = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(e for e in entries if e))


def run(cmd: list, timeout: float, env_extra: dict | None = None, cwd=ROOT):
    """``cmd`` with the repository prepended to ``PYTHONPATH``; ``(returncode, output)``."""
    env = {**os.environ, "PYTHONPATH": python_path(), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    done = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


# -- environment ----------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nvidia_smi() -> str | None:
    """``name, driver_version, memory.total`` per GPU, or ``None`` without ``nvidia-smi``."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def faiss_info() -> dict:
    """Whether faiss imports, its version, build (``GPU``: has ``StandardGpuResources``) and the
    GPUs it sees."""
    try:
        faiss = importlib.import_module("faiss")  # optional: whether it is there is reported
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    return {
        "installed": True,
        "version": getattr(faiss, "__version__", "unknown"),
        "build": "GPU" if hasattr(faiss, "StandardGpuResources") else "CPU",
        "gpus": int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0,
    }


def part_environment(args) -> dict:
    gpus = [
        {
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / GIB, 1),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
        }
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    ]
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus,
        "nvidia_smi": nvidia_smi(),
        "pytorch_metric_learning": pytorch_metric_learning.__version__,
        "pml_rank_plugins": pml_rank_plugins.__version__,
        "faiss": faiss_info(),
        "dependencies": check_dependencies(),
    }
    lines = [f"- {key}: {value}" for key, value in info.items() if key != "dependencies"]
    lines.append(f"- faiss for the k-NN: {faiss_route(info['faiss'])}")
    absent = missing(info["dependencies"])
    lines += [
        f"- runtime dependencies (pyproject): {len(info['dependencies'])} checked, "
        f"missing: {', '.join(absent) or 'none'}"
    ]
    problems = [f"missing runtime dependencies: {'; '.join(absent)}"] if absent else []
    if args.device == "cuda" and not gpus:
        problems.insert(0, "--device cuda, but torch.cuda.is_available() is False")
    if problems:
        return fail("; ".join(problems), info, lines)
    return done("pass", None, info, lines)


# -- tests ----------------------------------------------------------------------------------------
def device_test_dirs() -> list[str]:
    """``DEVICE_TEST_DIRS`` of ``tests/conftest.py`` (the directories that honour
    ``TEST_DEVICE``), read without importing it (its import sets torch's thread count)."""
    tree = ast.parse(Path(ROOT, "tests", "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "DEVICE_TEST_DIRS" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("tests/conftest.py defines no DEVICE_TEST_DIRS")


def part_tests(args) -> dict:
    dirs = device_test_dirs()
    chosen = [t for t in os.environ.get(TESTS_ENV, "").split(os.pathsep) if t]
    targets = chosen or (TINY_TESTS if args.tiny else [f"tests/{name}" for name in dirs])
    # Half the cores (the GPU machines have 16): each worker holds a CUDA context of its own.
    workers = str(min(8, (os.cpu_count() or 1) // 2)) if not args.tiny else "0"
    workers = "0" if workers in ("0", "1") else workers
    junit = Path(args.out, "junit.xml").resolve()
    junit.unlink(missing_ok=True)
    options = ["-q", "-ra", "-p", "no:cacheprovider", "-n", workers, "-m", "not slow"]
    options += [f"--junitxml={junit}", *targets]
    if args.tiny:  # in this process: one torch import fewer (see gpu_check_here)
        import pytest  # only this part needs it

        with run_here(["pytest", *options], {"TEST_DEVICE": args.device}) as buffer:
            code = int(pytest.main(options))
        output = buffer.getvalue()
    else:
        cmd = [sys.executable, "-m", "pytest", *options]
        code, output = run(cmd, args.budget, {"TEST_DEVICE": args.device})
    Path(args.out, PYTEST_LOG).write_text(output)
    counts = parse_pytest(output)
    groups = failure_groups(junit) if junit.is_file() else []
    details = {"targets": targets, "test_device": args.device, "returncode": code, **counts}
    details["failure_groups"] = groups
    lines = [
        f"`TEST_DEVICE={args.device} pytest -m 'not slow' {' '.join(targets)}` "
        f"(directories honouring TEST_DEVICE: {', '.join(dirs)})",
        "",
        f"passed {counts['passed']}, failed {counts['failed']}, errors {counts['errors']}, "
        f"skipped {counts['skipped']}; the whole output: `logs/tests_{PYTEST_LOG}`",
    ]
    if groups:
        lines += ["", "Failures by their first error line:", "", *group_lines(groups)]
    elif code != 0:  # no JUnit report (a collection or start-up error): the output's end
        lines += ["", "```", tail(output, 20), "```"]
    if code != 0 or counts["passed"] == 0:
        top = f"; most common: {groups[0]['count']} x {groups[0]['error']}" if groups else ""
        return fail(f"pytest exit code {code}: {counts['summary']}{top}", details, lines)
    return done("pass", None, details, lines)


# -- benchmarks -----------------------------------------------------------------------------------
def bench_plan(args) -> list[tuple[str, list[str]]]:
    """Each benchmark script with its size arguments (``--tiny``: toy sizes)."""
    if args.tiny:
        sizes, pml_max, memory, batch = ["64", "128"], "64", "128", "16"
    elif args.device == "cuda":  # PML where it fits: an out-of-memory case is recorded, skipped
        sizes, pml_max, memory, batch = ["4096", "16384", "65536"], "65536", "65536", "256"
    else:
        sizes, pml_max, memory, batch = ["1024", "4096"], "4096", "65536", "256"
    pairwise = ["--sizes", *sizes, "--pml-max", pml_max]
    return [
        ("bench_histogram_ap.py", pairwise),
        ("bench_ranked_list.py", pairwise),
        ("bench_memory_bank.py", ["--memory", memory, "--batch", batch]),
    ]


def part_benchmarks(args) -> dict:
    timing = (
        ["--warmup", "0", "--repeats", "1"] if args.tiny else ["--warmup", "1", "--repeats", "3"]
    )
    common = ["--device", args.device, "--autocast", "none", "bfloat16", "--in-process"]
    common += [*timing, "--rounds", "1", "--threads", str(min(os.cpu_count() or 1, 8))]
    results, lines, failures = {}, [], []
    deadline = time.monotonic() + args.budget
    for script, sizes in bench_plan(args):
        out = Path(args.out, script.replace(".py", ".json"))
        path, argv = ROOT / "benchmarks" / script, [*sizes, *common, "--json", out]
        try:
            if args.tiny:  # toy sizes, not timed: in this process (see gpu_check_here)
                code, output = run_script_here(path, argv)
            else:
                left = max(1.0, deadline - time.monotonic())
                code, output = run([sys.executable, path, *argv], left)
        except subprocess.TimeoutExpired:
            failures.append(f"{script}: timed out")
            continue
        Path(args.out, script.replace(".py", ".log")).write_text(output)
        if code != 0 or not out.is_file():
            failures.append(f"{script}: exit code {code}: {tail(output, 3)}")
            continue
        results[script] = json.loads(out.read_text())
        lines += bench_table(script, results[script])
    targets = check_targets(results) if args.device == "cuda" and not args.tiny else {}
    lines += [f"- target {name}: {verdict}" for name, verdict in targets.items()]
    details = {"results": results, "targets": targets, "failures": failures}
    if failures:
        return fail("; ".join(failures), details, lines)
    return done("pass", None, details, lines)


def bench_table(script: str, result: dict) -> list[str]:
    """A Markdown table: one row per dtype, size and case (time, peak, or the error)."""
    lines = [
        f"`{script}` on {result['device_name']}:",
        "",
        "| autocast | N | case | s | peak MiB |",
    ]
    lines.append("| --- | ---: | --- | ---: | ---: |")
    for table in result["tables"]:
        rows = table.get("sizes") or [{"n": result.get("memory"), "cases": table["cases"]}]
        for row in rows:
            for case, r in row["cases"].items():
                seconds = r.get("error") or f"{r['time']:.4f}"
                peak = "-" if r.get("peak") is None else f"{r['peak'] / 2**20:.0f}"
                lines.append(f"| {table['autocast']} | {row['n']} | {case} | {seconds} | {peak} |")
    return lines + [""]


def check_targets(results: dict) -> dict:
    """The issue's targets from float32 results: ``{name: "met (...)" | "NOT met (...)" |
    "not measured (...)"}``."""

    def cases(script: str, n: int) -> dict:
        tables = results.get(script, {}).get("tables", [])
        fp32 = next((t for t in tables if t["autocast"] == "none"), {"sizes": []})
        return next((row["cases"] for row in fp32["sizes"] if row["n"] == n), {})

    def value(r: dict | None, key: str):
        return None if not r or r.get(key) is None else r[key]

    verdicts = {}
    hist, rll = cases("bench_histogram_ap.py", 4096), cases("bench_ranked_list.py", 4096)
    checks = [("FastAP", hist, "ours"), ("mAP_Q", hist, "qap"), ("RankedList", rll, "ours")]
    for name, got, case in checks:
        ours, pml, floor = (value(got.get(c), "time") for c in (case, "pml", "floor"))
        if ours is None or pml is None:
            verdicts[f"{name} vs PML at N=4096"] = "not measured (a case failed or was skipped)"
        else:
            speed = pml / ours
            ok = "met" if speed >= SPEED_TARGETS[name] else "NOT met"
            verdicts[f"{name} vs PML at N=4096"] = (
                f"{ok} ({speed:.1f}x, target >= {SPEED_TARGETS[name]:g}x)"
            )
        if name != "RankedList":
            if ours is None or floor is None:
                verdicts[f"{name} vs floor at N=4096"] = "not measured"
            else:
                ok = "met" if ours / floor <= FLOOR_TARGET else "NOT met"
                verdicts[f"{name} vs floor at N=4096"] = (
                    f"{ok} ({ours / floor:.2f}x, target <= 1.5x)"
                )
    hist, rll = cases("bench_histogram_ap.py", 65536), cases("bench_ranked_list.py", 65536)
    for name, got, case in [
        ("FastAP", hist, "ours"),
        ("mAP_Q", hist, "qap"),
        ("RankedList", rll, "ours"),
    ]:
        peak = value(got.get(case), "peak")
        key = f"{name} peak at N=65536"
        if peak is None:
            verdicts[key] = "not measured (failed, skipped or not a CUDA peak)"
        else:
            ok = "met" if peak / GIB < MEMORY_TARGET_GIB else "NOT met"
            verdicts[key] = f"{ok} ({peak / GIB:.2f} GiB, target < 8 GiB)"
    return verdicts


# -- training -------------------------------------------------------------------------------------
def finite_losses(run_dir: Path) -> tuple[int, bool]:
    """Rows of ``logs/loss_histories.csv`` and whether every loss value is finite."""
    with open(run_dir / "logs" / "loss_histories.csv") as f:
        rows = list(csv.DictReader(f))
    values = [float(v) for row in rows for k, v in row.items() if k != "~iteration~"]
    return len(rows), bool(values) and all(math.isfinite(v) for v in values)


def check_training_run(run_dir: Path, dtype: str) -> list[str]:
    """What is wrong with a finished AMP run folder (empty: nothing)."""
    problems = []
    metrics = json.loads((run_dir / "metrics.json").read_text())
    info = metrics.get("run_info", {})
    if metrics.get("status") != "finished":
        problems.append(f"status {metrics.get('status')!r}")
    if (info.get("amp") or {}).get("dtype") != dtype:
        problems.append(f"run_info.amp {info.get('amp')!r}, expected dtype {dtype}")
    if not all(str(d).startswith("cuda") for d in info.get("devices", [])):
        problems.append(f"run_info.devices {info.get('devices')!r} are not CUDA")
    rows, finite = finite_losses(run_dir)
    if not finite:
        problems.append(f"non-finite or missing losses in logs/loss_histories.csv ({rows} rows)")
    test = [v for split in metrics.get("test", {}).values() for v in split.values()]
    if not test or not all(math.isfinite(v) for v in test):
        problems.append(f"test metrics missing or not finite: {metrics.get('test')}")
    if dtype == "float16":
        extra = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["extra"]
        if not (extra.get("grad_scaler") or {}).get("scale"):
            problems.append(f"no GradScaler state in the checkpoint: {extra!r}")
    return problems


def part_training(args) -> dict:
    reason = cuda_refusal(args.device)
    if reason:
        return done("skipped", reason, {}, [])
    iterations = "2" if args.tiny else "25"
    details, lines, problems = {}, [], []
    for dtype in ("bfloat16", "float16"):
        run_dir = Path(args.out, f"train_{dtype}")
        cmd = [sys.executable, "-m", "pml_rank_plugins.cli", "train", "configs/default.yaml"]
        cmd += ["--method", "plugin FastAP", "--device", "cuda", "--out", run_dir, "--overwrite"]
        for setting in ("num_epochs=1", f"iterations_per_epoch={iterations}", f"amp.dtype={dtype}"):
            cmd += ["--set", f"trainer.{setting}"]
        start = time.monotonic()
        code, output = run(cmd, args.budget / 2)
        found = (
            [f"exit code {code}: {tail(output, 5)}"]
            if code != 0
            else check_training_run(run_dir, dtype)
        )
        details[dtype] = {"seconds": round(time.monotonic() - start, 1), "problems": found}
        lines.append(
            f"- AMP {dtype}: {'ok' if not found else '; '.join(found)} ({details[dtype]['seconds']} s)"
        )
        problems += [f"{dtype}: {p}" for p in found]
    if problems:
        return fail("; ".join(problems), details, lines)
    return done("pass", None, details, lines)


# -- the frame of every part ---------------------------------------------------------------------
def done(status: str, reason: str | None, details: dict, lines: list[str]) -> dict:
    """A part's result (``lines``: its section of ``gpu_check.md``)."""
    return {"status": status, "reason": reason, "details": details, "markdown": lines}


def fail(reason: str, details: dict, lines: list[str]) -> dict:
    return done("fail", reason, details, lines)


def part_parser(parts: list[str]) -> argparse.ArgumentParser:
    """The command line of a part module (``parts``: its part names)."""
    parser = argparse.ArgumentParser(description="one part of scripts/gpu_check.py")
    parser.add_argument("part", choices=parts)
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for subprocesses")
    return parser


def part_main(parts: dict[str, Callable], parser: argparse.ArgumentParser | None = None) -> None:
    """Runs the part named on the command line and writes its ``result.json``; an exception
    makes the part fail with its traceback (``gpu_check.py`` goes on with the next part)."""
    args = (parser or part_parser(list(parts))).parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    try:
        result = parts[args.part](args)
    except subprocess.TimeoutExpired as e:
        result = fail(f"a subprocess ran past its limit: {e}", {}, [])
    except Exception as e:  # noqa: BLE001 -- reported as the part's failure, with the traceback
        result = fail(f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()}, [])
    Path(args.out, "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


PARTS = {
    "environment": part_environment,
    "tests": part_tests,
    "benchmarks": part_benchmarks,
    "training": part_training,
}

if __name__ == "__main__":
    part_main(PARTS)
