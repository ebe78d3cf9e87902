"""What the ``tests`` part of ``scripts/gpu_check.py`` reads from pytest: the summary counts
(:func:`parse_pytest`) and the failures grouped by their first error line, from pytest's JUnit
XML report (:func:`failure_groups`, :func:`group_lines`), so the report says why tests failed,
how many share each cause and which they are."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN_IDS = 5  # test ids per failure group in gpu_check.md (all of them in gpu_check.json)


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def parse_pytest(output: str) -> dict:
    """Counts from pytest's last summary line, failing test ids and skip reasons (``-ra``)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    summary = [
        ln for ln in output.splitlines() if SUMMARY.search(ln) and re.search(r" in [\d.]+s", ln)
    ]
    line = summary[-1] if summary else (output.strip().splitlines() or [""])[-1]
    for number, word in SUMMARY.findall(line):
        counts["errors" if word.startswith("error") else word] = int(number)
    failed = [ln.split()[1] for ln in output.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    skips = [ln for ln in output.splitlines() if ln.startswith("SKIPPED ")]
    return {**counts, "failed_ids": failed[:30], "skip_reasons": skips[:10], "summary": line}


def test_id(classname: str, name: str) -> str:
    """A JUnit ``classname`` (``tests.losses.test_fastap`` or ``...test_x.TestClass``) and
    ``name`` as the pytest id to rerun: ``tests/losses/test_fastap.py::test_y[float32]``."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if Path(ROOT, path).is_file() or Path(path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}" if classname else name  # a file outside the rootdir: no path


def first_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no message)"
    return line if len(line) <= 300 else line[:297] + "..."


def failure_groups(junit: Path) -> list[dict]:
    """The failures and errors of a pytest JUnit XML report grouped by the first line of their
    error: ``[{"error", "count", "tests": [ids]}]``, largest group first."""
    groups: dict[str, list[str]] = {}
    for case in ET.parse(junit).iter("testcase"):
        for kind in ("failure", "error"):
            for element in case.findall(kind):
                key = first_line(element.get("message") or element.text or kind)
                if kind == "error":
                    key = f"(error in set-up or tear-down) {key}"
                groups.setdefault(key, []).append(
                    test_id(case.get("classname", ""), case.get("name", ""))
                )
    ordered = sorted(groups.items(), key=lambda item: -len(item[1]))
    return [{"error": key, "count": len(ids), "tests": ids} for key, ids in ordered]


def group_lines(groups: list[dict]) -> list[str]:
    """Markdown: one item per group, its count, error line and first test ids."""
    lines = []
    for group in groups:
        shown = ", ".join(f"`{t}`" for t in group["tests"][:SHOWN_IDS])
        more = len(group["tests"]) - SHOWN_IDS
        lines.append(
            f"- {group['count']} x `{group['error']}`: {shown}"
            + (f" and {more} more (gpu_check.json)" if more > 0 else "")
        )
    return lines
