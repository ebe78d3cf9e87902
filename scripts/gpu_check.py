"""The GPU validation kit (issue 31): one command that checks the CUDA paths and measures them.

``scripts/gpu_check.sh [--device cuda|cpu] [--tiny] --out OUT`` runs six parts, each in its own
process (``scripts/gpu_check_parts.py``, ``gpu_check_dist.py``, ``gpu_check_knn.py``: see
:data:`PART_SCRIPTS`) with its own time limit, goes on after a part that
fails or runs out of time, and writes ``OUT/gpu_check.md`` and ``OUT/gpu_check.json`` after
every part (a run cut short still leaves what it found):

* ``environment`` -- GPU name, driver and CUDA versions, torch, PML, faiss (CPU or GPU build:
  the CPU fallback and the faiss-gpu route named), CPU model and threads, and every runtime
  dependency of ``pyproject.toml`` (the part fails naming each missing one);
* ``tests`` -- ``TEST_DEVICE=<device> pytest -m "not slow"`` over the directories that honour
  ``TEST_DEVICE`` (``tests/conftest.py``'s ``DEVICE_TEST_DIRS``; ``--tests``: other targets),
  pass/fail counts and the failures grouped by their first error line, with counts and test ids
  (from pytest's JUnit report); the whole pytest output in ``OUT/parts/tests/pytest.txt``;
* ``benchmarks`` -- FastAP, mAP_Q and RankedList against PML's losses and the floor, forward +
  backward, N = 4096, 16384, 65536 (PML recorded as out of memory where it does not fit),
  float32 and bfloat16 autocast, peak CUDA memory, and the memory bank (batch 256 against
  65,536); the issue's targets checked on CUDA;
* ``training`` (CUDA only) -- ``pml-rank train configs/default.yaml --method "plugin FastAP"``
  with bfloat16 and float16 (GradScaler) autocast, finite losses and ``metrics.json`` checked;
* ``distributed`` -- ``torchrun --nproc_per_node=2`` on the one device equal to one process on
  the same global batch, and the process-group timeout path;
* ``knn`` -- PML's ``AccuracyCalculator`` with faiss-gpu when installed (else on CUDA the exact
  torch search ``TorchKNN``, named), equal to PML's exact search; ``TorchKNN`` timed against
  faiss-cpu at SOP scale (60,502 x 128 queries against themselves).

Before the parts, a runtime dependency whose module is not found makes the kit install the wheels
of ``--wheels`` (default ``.device-wheels/``, made by ``make gpu-wheels``: a bare GPU machine has
no network) that are not installed, and the report says what it installed
(``gpu_check_deps.py``). After each part its logs (the pytest output, torchrun's) are copied to
``OUT/logs/PART_NAME``: one folder down, so a transfer limited to a few files and two folder
levels brings back ``gpu_check.md``, ``gpu_check.json`` and the logs.

``--tiny`` uses toy sizes (N = 64, 128; a few test files; two training iterations) so CI runs
the same script on the CPU in well under a minute (``tests/test_gpu_check.py``); it runs the
benchmark scripts and pytest inside their part's process (toy sizes are not timed; a full run
gives each a fresh process), and the selected parts one after another in one process instead of
one process each (``gpu_check_group.py``, :func:`run_group`: their limits added up, their results
reported when that process ends; the processes a part starts itself, ``torchrun`` and its ranks,
are still started). Parts that need CUDA are
reported ``skipped`` with the reason under ``--device cpu``, without starting a process. On one
H100-class GPU the per-part limits add up to under 8 minutes (:data:`LIMITS_S`, :data:`TOTAL_S`).
Exit status: 0 when no part failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from gpu_check_deps import DEFAULT_WHEELS, install_missing

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("environment", "tests", "benchmarks", "training", "distributed", "knn")
PART_SCRIPTS = {
    part: Path(__file__).with_name(name)
    for part, name in [
        ("environment", "gpu_check_parts.py"),
        ("tests", "gpu_check_parts.py"),
        ("benchmarks", "gpu_check_parts.py"),
        ("training", "gpu_check_parts.py"),
        ("distributed", "gpu_check_dist.py"),
        ("knn", "gpu_check_knn.py"),
    ]
}
CUDA_ONLY = {"training": "no CUDA device (--device cpu)"}
# --tiny: the parts share one process (run_group; gpu_check_group.py imports these scripts); a
# part given another script in PART_SCRIPTS (a test's stand-in) runs alone
GROUP_SCRIPT = Path(__file__).with_name("gpu_check_group.py")
GROUPED = dict(PART_SCRIPTS)
# Seconds per part on a GPU (full sizes) and with --tiny; a part never gets more than what is
# left of TOTAL_S. The full limits add up to 470 s: under 8 minutes with process start-up.
LIMITS_S = {
    "environment": 30,
    "tests": 120,
    "benchmarks": 180,
    "training": 60,
    "distributed": 45,
    "knn": 35,
}
# --tiny takes about 20 s of CPU on 2 cores (40 s wall under a load of 8); room for a busy CI.
# The parts run_group runs together get the sum of their limits.
TINY_LIMITS_S = {
    "environment": 60,
    "tests": 90,
    "benchmarks": 120,
    "training": 60,
    "distributed": 120,
    "knn": 60,
}
TOTAL_S = 470.0
GRACE_S = 5.0  # after SIGTERM, before SIGKILL of a part's process group
MIN_PART_S = 5.0  # a part with less than this left is skipped
STATUSES = ("pass", "fail", "skipped")


def run_part(
    part: str, device: str, tiny: bool, out: Path, limit_s: float, python: str = sys.executable
) -> dict:
    """Runs one part in its own process group, at most ``limit_s`` seconds.

    Returns:
        ``{"status", "reason", "seconds", "limit_s", "details", "markdown"}``: the part's
        ``result.json``, or a failure saying why there is none (time limit, crash).
    """
    folder = part_folder(out, part)
    cmd = [python, str(PART_SCRIPTS[part]), part, "--device", device, "--out", str(folder)]
    # subprocesses of the part get the part's limit less a margin to write their result
    cmd += ["--budget", str(budget(limit_s))] + (["--tiny"] if tiny else [])
    code, timed_out, seconds = run_process(cmd, folder / "log.txt", limit_s)
    if timed_out:
        return failed(f"ran past its limit of {limit_s:g} s", seconds, limit_s)
    return part_result(folder, folder / "log.txt", code, seconds, limit_s, late=None)


def run_group(
    parts: list[str],
    device: str,
    tiny: bool,
    out: Path,
    limits: dict[str, float],
    limit_s: float,
    python: str = sys.executable,
) -> dict[str, dict]:
    """``--tiny``: runs ``parts`` one after another in one process group (``gpu_check_group.py``,
    which imports their scripts, :data:`GROUPED`), at most ``limit_s`` seconds in all; each part
    gets the ``--budget`` of its own limit in ``limits``.

    Returns:
        ``{part: result}``, each as :func:`run_part` returns it (``seconds``: the part's own); a
        part without ``result.json`` when the process ended fails, saying why.
    """
    folders = {part: part_folder(out, part) for part in parts}
    log = out / "parts" / "group_log.txt"
    cmd = [python, str(GROUP_SCRIPT), str(out), *(f"{p}={budget(limits[p])}" for p in parts)]
    cmd += ["--device", device] + (["--tiny"] if tiny else [])
    code, timed_out, seconds = run_process(cmd, log, limit_s)
    late = f"ran past the limit of {limit_s:g} s of the process of {', '.join(parts)} (--tiny)"
    return {
        part: part_result(folder, log, code, seconds, limits[part], late if timed_out else None)
        for part, folder in folders.items()
    }


def part_folder(out: Path, part: str) -> Path:
    """``OUT/parts/PART``, made, without a ``result.json`` from an earlier run."""
    folder = out / "parts" / part
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").unlink(missing_ok=True)
    return folder


def budget(limit_s: float) -> float:
    """A part's ``--budget`` (for its subprocesses): its limit less a margin to write its
    result."""
    return max(1.0, limit_s - 10.0)


def run_process(cmd: list, log: Path, limit_s: float) -> tuple[int | None, bool, float]:
    """``cmd`` in its own process group with the repository on ``PYTHONPATH``, output into
    ``log``, stopped (:func:`stop_group`) after ``limit_s`` seconds: ``(exit code, timed out,
    seconds)``."""
    entries = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(e for e in entries if e))}
    start = time.monotonic()
    with open(log, "w") as output:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code, timed_out = proc.returncode, True
    return code, timed_out, round(time.monotonic() - start, 1)


def part_result(
    folder: Path, log: Path, code: int | None, seconds: float, limit_s: float, late: str | None
) -> dict:
    """The part's ``folder/result.json`` (its own ``seconds`` when it has them), or a failure:
    ``late`` (the reason when the process ran past its limit), or the exit code and the tail of
    ``log`` when there is no result, or a malformed result."""
    result_file = folder / "result.json"
    if not result_file.is_file():
        if late:
            return failed(late, seconds, limit_s)
        log_tail = "\n".join(log.read_text().strip().splitlines()[-5:])
        return failed(f"exit code {code} and no result.json: {log_tail}", seconds, limit_s)
    result = json.loads(result_file.read_text())
    missing = {"status", "reason", "details", "markdown"} - set(result)
    if missing or result["status"] not in STATUSES:
        reason = (
            f"malformed result.json (missing {sorted(missing)}, status {result.get('status')!r})"
        )
        return failed(reason, seconds, limit_s)
    return {"seconds": seconds, "limit_s": limit_s, **result}


def failed(reason: str, seconds: float, limit_s: float) -> dict:
    """A failed part's result."""
    return {
        "status": "fail",
        "reason": reason,
        "seconds": seconds,
        "limit_s": limit_s,
        "details": {},
        "markdown": [],
    }


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group (torchrun, pytest and their children), then SIGKILL
    after :data:`GRACE_S`."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def skipped(reason: str) -> dict:
    return {
        "status": "skipped",
        "reason": reason,
        "seconds": 0.0,
        "limit_s": 0.0,
        "details": {},
        "markdown": [],
    }


# logs copied to OUT/logs/PART_NAME after each part: one folder down from OUT, so a transfer
# limited to a few files (8) and two folder levels brings them back with the report; a part's
# own log.txt only when the part failed
LOGS = ("pytest.txt", "torchrun.log")


def copy_logs(out: Path, part: str, failed: bool) -> list[str]:
    """Copies the part's logs (:data:`LOGS`, and ``log.txt`` when it ``failed``) that are not
    empty to ``OUT/logs/PART_NAME``; returns their paths relative to ``out``."""
    copied = []
    for name in [*LOGS, "log.txt"] if failed else LOGS:
        source = out / "parts" / part / name
        if source.is_file() and source.stat().st_size:
            target = out / "logs" / f"{part}_{name}"
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(str(target.relative_to(out)))
    return copied


def write_report(out: Path, report: dict) -> None:
    """``gpu_check.json`` (everything) and ``gpu_check.md`` (summary table, then each part)."""
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text("\n".join(markdown(report)) + "\n")


def markdown(report: dict) -> list[str]:
    args = report["args"]
    lines = [
        "# GPU check",
        "",
        f"`scripts/gpu_check.sh --device {args['device']}{' --tiny' if args['tiny'] else ''}` "
        f"on {report['host']}, started {report['started']}, {report['total_seconds']:.0f} s "
        f"in all{'' if report['complete'] else ' (incomplete: still running or cut short)'}.",
        "",
        f"Set-up: {report['setup']['message']}",
        "",
        "| part | status | seconds | limit s | reason |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for part in PARTS:
        r = report["parts"].get(part)
        if r is None:
            lines.append(f"| {part} | not run yet | - | - | - |")
            continue
        reason = (r.get("reason") or "").replace("\n", " ").replace("|", "/")
        lines.append(f"| {part} | {r['status']} | {r['seconds']} | {r['limit_s']:g} | {reason} |")
    for part in PARTS:
        r = report["parts"].get(part)
        if r and r.get("markdown"):
            lines += ["", f"## {part}", "", *r["markdown"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy sizes (CI on the CPU); the parts run in one process",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the report")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts"
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=DEFAULT_WHEELS,
        help="wheels installed when a runtime dependency is missing (make gpu-wheels)",
    )
    parser.add_argument(
        "--tests", nargs="+", help="the tests part's pytest targets (default: the device dirs)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tests:  # read by the tests part (gpu_check_parts.TESTS_ENV), in its process
        os.environ["GPU_CHECK_TESTS"] = os.pathsep.join(args.tests)
    setup = install_missing(args.wheels)
    print(f"gpu_check: set-up: {setup['message']}", flush=True)
    limits = TINY_LIMITS_S if args.tiny else LIMITS_S
    start = time.monotonic()
    report = {
        "schema": 1,
        "args": {"device": args.device, "tiny": args.tiny, "parts": args.parts},
        "host": platform.node(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "total_seconds": 0.0,
        "complete": False,
        "setup": setup,
        "parts": {},
    }
    runnable = [p for p in args.parts if not (args.device == "cpu" and p in CUDA_ONLY)]
    grouped = [p for p in PARTS if p in runnable and PART_SCRIPTS[p] == GROUPED[p]]
    done: dict[str, dict] = {}  # results of a --tiny group, reported part by part
    for part in PARTS:
        left = TOTAL_S - (time.monotonic() - start)
        if part in done:
            result = done.pop(part)
        elif part not in args.parts:
            result = skipped("not selected (--parts)")
        elif args.device == "cpu" and part in CUDA_ONLY:
            result = skipped(CUDA_ONLY[part])
        elif left < MIN_PART_S:
            result = skipped(f"the total limit of {TOTAL_S:g} s was spent")
        elif args.tiny and part in grouped and len(grouped) > 1:
            limit = min(sum(limits[p] for p in grouped), left)
            print(f"gpu_check: {', '.join(grouped)} (limit {limit:.0f} s) ...", flush=True)
            done = run_group(grouped, args.device, args.tiny, args.out, limits, limit)
            result = done.pop(part)
        else:
            print(f"gpu_check: {part} (limit {min(limits[part], left):.0f} s) ...", flush=True)
            result = run_part(part, args.device, args.tiny, args.out, min(limits[part], left))
        result["logs"] = copy_logs(args.out, part, result["status"] == "fail")
        report["parts"][part] = result
        report["total_seconds"] = round(time.monotonic() - start, 1)
        print(f"gpu_check: {part}: {result['status']} {result.get('reason') or ''}", flush=True)
        write_report(args.out, report)
    report["complete"] = True
    write_report(args.out, report)
    print(f"gpu_check: report in {args.out / 'gpu_check.md'} and gpu_check.json")
    return 1 if any(r["status"] == "fail" for r in report["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
