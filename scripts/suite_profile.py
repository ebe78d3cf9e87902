"""Where the test suite's CPU goes: per test, this process's CPU and its subprocesses' (issue 30).

``make test``'s wall time on 2 cores is bounded below by its CPU time over 2. This records, for
every test (setup + call + teardown, so a module-scoped fixture counts towards the first test
that uses it), the CPU seconds of the pytest worker itself (``RUSAGE_SELF``) and of the processes
it started and waited for (``RUSAGE_CHILDREN``: tune and ``--jobs`` workers, torchrun ranks,
notebook kernels, CLI subprocesses, and their own children once reaped), then prints the totals
and the most expensive files and tests.

Usage (the plugin is this file, loaded by name from ``scripts/``)::

    SUITE_PROFILE_DIR=/tmp/prof PYTHONPATH=scripts .venv/bin/python -m pytest -n 2 \\
        --dist loadfile -q -p suite_profile
    .venv/bin/python scripts/suite_profile.py /tmp/prof [--top 25]

Each pytest process (the xdist workers) appends one JSON line per test to
``SUITE_PROFILE_DIR/cpu_<pid>.jsonl``: ``{"id", "self", "children", "wall"}`` in seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

ENV = "SUITE_PROFILE_DIR"
_FOLDER: Path | None = None  # set by pytest_configure


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Records ``item``'s CPU (this process, its reaped children) and wall seconds."""
    before = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter())
    yield
    after = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter())
    record = dict(zip(("self", "children", "wall"), (b - a for a, b in zip(before, after))))
    with open(_FOLDER / f"cpu_{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps({"id": item.nodeid, **record}) + "\n")


def pytest_configure(config):
    """The records' folder, from ``SUITE_PROFILE_DIR`` (a usage error without it)."""
    global _FOLDER
    if not os.environ.get(ENV):
        raise pytest.UsageError(f"-p suite_profile: set {ENV} to the folder for the records")
    _FOLDER = Path(os.environ[ENV])
    _FOLDER.mkdir(parents=True, exist_ok=True)


def read_records(folder: Path) -> list[dict]:
    """Every record of ``folder``'s ``cpu_*.jsonl`` files."""
    files = sorted(Path(folder).glob("cpu_*.jsonl"))
    if not files:
        raise SystemExit(f"suite_profile: no cpu_*.jsonl in {folder} (run pytest with the plugin)")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def report(records: list[dict], top: int) -> str:
    """Markdown: the totals, then the ``top`` files and tests by CPU (self + children)."""
    by_file = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in records:
        row = by_file[r["id"].split("::")[0]]
        row[0] += r["self"]
        row[1] += r["children"]
        row[2] += r["wall"]
        row[3] += 1
    own, children = sum(r["self"] for r in records), sum(r["children"] for r in records)
    lines = [
        f"{len(records)} tests: {own:.0f} CPU s in the pytest workers, {children:.0f} CPU s in "
        f"the processes they started, {own + children:.0f} in all "
        f"(>= {(own + children) / 2:.0f} s of wall time on 2 cores)",
        "",
        "| file | tests | CPU s | of which subprocesses | wall s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for name, (s, c, w, n) in ranked[:top]:
        lines.append(f"| {name} | {n} | {s + c:.1f} | {c:.1f} | {w:.1f} |")
    lines += [
        "",
        "| test | CPU s | of which subprocesses | wall s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in sorted(records, key=lambda r: -(r["self"] + r["children"]))[:top]:
        cpu = r["self"] + r["children"]
        lines.append(f"| {r['id']} | {cpu:.1f} | {r['children']:.1f} | {r['wall']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help=f"the {ENV} of the run, e.g. /tmp/prof")
    parser.add_argument("--top", type=int, default=25, help="rows per table, e.g. 10")
    args = parser.parse_args(argv)
    print(report(read_records(args.folder), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
