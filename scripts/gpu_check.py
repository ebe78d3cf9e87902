"""The GPU validation kit (issue 31): one command that checks the CUDA paths and measures them.

``scripts/gpu_check.sh [--device cuda|cpu] [--tiny] --out OUT`` runs six parts, each in its own
process (``scripts/gpu_check_parts.py``, ``gpu_check_dist.py``, ``gpu_check_knn.py``: see
:data:`PART_SCRIPTS`) with its own time limit, goes on after a part that
fails or runs out of time, and writes ``OUT/gpu_check.md`` and ``OUT/gpu_check.json`` after
every part (a run cut short still leaves what it found):

* ``environment`` -- GPU name, driver and CUDA versions, torch, PML, faiss (CPU or GPU build),
  CPU model and threads;
* ``tests`` -- ``TEST_DEVICE=<device> pytest -m "not slow"`` over the directories that honour
  ``TEST_DEVICE`` (``tests/conftest.py``'s ``DEVICE_TEST_DIRS``), pass/fail counts;
* ``benchmarks`` -- FastAP, mAP_Q and RankedList against PML's losses and the floor, forward +
  backward, N = 4096, 16384, 65536 (PML recorded as out of memory where it does not fit),
  float32 and bfloat16 autocast, peak CUDA memory, and the memory bank (batch 256 against
  65,536); the issue's targets checked on CUDA;
* ``training`` (CUDA only) -- ``pml-rank train configs/default.yaml --method "plugin FastAP"``
  with bfloat16 and float16 (GradScaler) autocast, finite losses and ``metrics.json`` checked;
* ``distributed`` -- ``torchrun --nproc_per_node=2`` on the one device equal to one process on
  the same global batch, and the process-group timeout path;
* ``knn`` -- PML's ``AccuracyCalculator`` with faiss-gpu when installed (else the CPU path,
  named), equal to PML's exact search.

``--tiny`` uses toy sizes (N = 64, 128; a few test files; two training iterations) so CI runs
the same script on the CPU in well under a minute (``tests/test_gpu_check.py``); it runs the
benchmark scripts and pytest inside their part's process (toy sizes are not timed; a full run
gives each a fresh process). Parts that need CUDA are reported ``skipped`` with the reason under
``--device cpu``, without starting a process. On one H100-class GPU the per-part limits add up
to under 8 minutes (:data:`LIMITS_S`, :data:`TOTAL_S`).
Exit status: 0 when no part failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

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
# Seconds per part on a GPU (full sizes) and with --tiny; a part never gets more than what is
# left of TOTAL_S. The full limits add up to 465 s: under 8 minutes with process start-up.
LIMITS_S = {
    "environment": 30,
    "tests": 120,
    "benchmarks": 180,
    "training": 60,
    "distributed": 45,
    "knn": 30,
}
# --tiny takes about 40 s of CPU on 2 cores (95 s wall under a load of 7); room for a busy CI
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
    folder = out / "parts" / part
    folder.mkdir(parents=True, exist_ok=True)
    result_file = folder / "result.json"
    result_file.unlink(missing_ok=True)
    cmd = [python, str(PART_SCRIPTS[part]), part, "--device", device, "--out", str(folder)]
    # subprocesses of the part get the part's limit less a margin to write their result
    cmd += ["--budget", str(max(1.0, limit_s - 10.0))] + (["--tiny"] if tiny else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.monotonic()
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code, timed_out = proc.returncode, True
    seconds = round(time.monotonic() - start, 1)
    base = {"seconds": seconds, "limit_s": limit_s, "details": {}, "markdown": []}
    if timed_out:
        return {**base, "status": "fail", "reason": f"ran past its limit of {limit_s:g} s"}
    if not result_file.is_file():
        log_tail = "\n".join((folder / "log.txt").read_text().strip().splitlines()[-5:])
        reason = f"exit code {code} and no result.json: {log_tail}"
        return {**base, "status": "fail", "reason": reason}
    result = json.loads(result_file.read_text())
    missing = {"status", "reason", "details", "markdown"} - set(result)
    if missing or result["status"] not in STATUSES:
        reason = (
            f"malformed result.json (missing {sorted(missing)}, status {result.get('status')!r})"
        )
        return {**base, "status": "fail", "reason": reason}
    return {**base, **result}


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
    parser.add_argument("--tiny", action="store_true", help="toy sizes (CI on the CPU)")
    parser.add_argument("--out", required=True, type=Path, help="folder for the report")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    limits = TINY_LIMITS_S if args.tiny else LIMITS_S
    start = time.monotonic()
    report = {
        "schema": 1,
        "args": {"device": args.device, "tiny": args.tiny, "parts": args.parts},
        "host": platform.node(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "total_seconds": 0.0,
        "complete": False,
        "parts": {},
    }
    for part in PARTS:
        left = TOTAL_S - (time.monotonic() - start)
        if part not in args.parts:
            result = skipped("not selected (--parts)")
        elif args.device == "cpu" and part in CUDA_ONLY:
            result = skipped(CUDA_ONLY[part])
        elif left < MIN_PART_S:
            result = skipped(f"the total limit of {TOTAL_S:g} s was spent")
        else:
            print(f"gpu_check: {part} (limit {min(limits[part], left):.0f} s) ...", flush=True)
            result = run_part(part, args.device, args.tiny, args.out, min(limits[part], left))
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
