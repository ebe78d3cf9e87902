"""``scripts/suite_profile.py``: the pytest plugin that records each test's CPU, in the pytest
process and in the processes it starts, and the report over those records (issue 30)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("suite_profile", ROOT / "scripts/suite_profile.py")
suite_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_profile)

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
TESTS = f"""
import subprocess, sys

def test_busy_here():
{"".join("    " + line + chr(10) for line in BUSY.splitlines())}
def test_busy_in_a_child():
    subprocess.run([sys.executable, "-c", {BUSY!r}], check=True)
"""


def run_pytest(tmp_path: Path, env_folder: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_generated.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != suite_profile.ENV}
    env["PYTHONPATH"] = str(ROOT / "scripts")
    if env_folder is not None:
        env[suite_profile.ENV] = env_folder
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_profile", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*cmd, "test_generated.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_records_cpu_of_the_test_and_of_its_children_then_reports_them(tmp_path, capsys):
    done = run_pytest(tmp_path, str(tmp_path / "prof"))
    assert done.returncode == 0, done.stdout + done.stderr
    records = {r["id"]: r for r in suite_profile.read_records(tmp_path / "prof")}
    here = records["test_generated.py::test_busy_here"]
    child = records["test_generated.py::test_busy_in_a_child"]
    assert here["self"] >= 0.25 and here["children"] < 0.05, here
    assert child["children"] >= 0.25 and child["self"] < 0.25, child
    assert all(r["wall"] >= 0.25 for r in (here, child))
    assert suite_profile.main([str(tmp_path / "prof"), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 tests: ") and "| test_generated.py | 2 |" in out
    test_rows = out.split("| test | CPU s")[1].splitlines()[2:]
    assert len(test_rows) == 1 and "::test_busy_" in test_rows[0]  # --top 1: one row


def test_without_the_folder_it_refuses_to_start(tmp_path):
    done = run_pytest(tmp_path, None)
    assert done.returncode != 0
    assert "set SUITE_PROFILE_DIR" in done.stderr + done.stdout
    assert not list(tmp_path.glob("**/cpu_*.jsonl"))
