"""The third audit's path cases (issue 28 items 1, 3, 5) through ``pml-rank``, as the audit ran them:
method names that left ``--out``, symlinked lock files and run folders, and two commands sharing
one ``--out``. Each test checks the exit status, the one-line message and that nothing outside
``--out`` (or in another command's live run folder) was created, changed or deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.reporting.summary import summarize_dir
from tests.lock_holder import hold_lock
from tests.log_capture import root_log_lines
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[1]


def methods_config(*names: str, epochs: int = 1) -> dict:
    """A tiny config whose ``methods:`` are ``names`` (each the shared config)."""
    cfg = tiny_config(trainer={"MetricLossOnly": {"num_epochs": epochs}})
    cfg.pop("name")
    cfg["methods"] = {name: None for name in names}
    return cfg


def tree(folder: Path) -> dict:
    """Every path below ``folder`` (links not followed) with its bytes, or None for folders."""
    return {
        p.relative_to(folder): (
            None if p.is_dir() and not p.is_symlink() else os.readlink(p) if p.is_symlink()
            else p.read_bytes()
        )
        for p in sorted(folder.rglob("*"))
    }  # fmt: skip


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("pml-rank:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- item 1


@pytest.mark.parametrize("name", ["..", ".", " .. ", ".._", "..\x00"])
def test_run_folder_escape_dotdot_method(tmp_path, monkeypatch, capsys, name):
    """``methods: {"..": ..., x: ...}``; ``mkdir -p p/logs; echo keep > p/logs/notes.txt;
    pml-rank train C.yaml --out p/runs --overwrite`` deleted ``notes.txt`` and the project's
    ``config.yaml``: now exit 2 naming the method, and nothing in ``p/`` changes."""
    monkeypatch.chdir(tmp_path)
    dump_yaml(methods_config(name, "x"), Path("C.yaml"))
    Path("p/logs").mkdir(parents=True)
    Path("p/logs/notes.txt").write_text("keep\n")
    Path("p/config.yaml").write_text("mine: 1\n")
    before = tree(Path("p"))
    for command in (["train"], ["compare"], ["tune", "--trials", "1"], ["check"]):
        args = [command[0], "C.yaml", *command[1:]]
        args += [] if command == ["check"] else ["--out", "p/runs"]
        args += ["--overwrite"] if command == ["train"] else []
        assert main(args) == 2, args
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"pml-rank: config error: method {name!r}: not a safe run folder")
        assert tree(Path("p")) == before, args
    assert Path("p/logs/notes.txt").read_text() == "keep\n"


def test_run_folder_escape_symlinked_method_folder(tmp_path, capsys):
    """A received ``--out`` whose method folder is a link out of it: compare refuses before any
    run (exit 1, one line) and creates nothing where the link points."""
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / "A").symlink_to(elsewhere)
    dump_yaml(methods_config("A", "B"), tmp_path / "C.yaml")
    assert main(["compare", str(tmp_path / "C.yaml"), "--out", str(out), "--overwrite"]) == 1
    line = one_line(capsys.readouterr().err)
    assert f"{out / 'A' / 'seed0'} resolves to {elsewhere / 'seed0'}, outside --out" in line
    assert list(elsewhere.iterdir()) == []


# --------------------------------------------------------------------------- item 3


def test_symlinked_lock_refused(tmp_path, monkeypatch, capsys):
    """``mkdir r; echo data > v; ln -s ../v r/.lock; pml-rank train C.yaml --method m --out r;
    cat v`` printed a pid: now ``v`` still holds ``data`` and the command exits 1, one line."""
    monkeypatch.chdir(tmp_path)
    dump_yaml(methods_config("m", "n"), Path("C.yaml"))
    Path("r").mkdir()
    Path("v").write_text("data\n")
    Path("r/.lock").symlink_to("../v")
    assert main(["train", "C.yaml", "--method", "m", "--out", "r"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("pml-rank: error: r/.lock is a symbolic link (to ../v)"), line
    assert Path("v").read_text() == "data\n"
    assert sorted(p.name for p in Path("r").iterdir()) == [".lock"]


def test_symlinked_run_folder_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    dump_yaml(methods_config("m"), Path("C.yaml"))
    Path("elsewhere").mkdir()
    Path("r").symlink_to("elsewhere")
    assert main(["train", "C.yaml", "--out", "r"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("pml-rank: error: r is a symbolic link (to elsewhere)"), line
    assert list(Path("elsewhere").iterdir()) == []


# --------------------------------------------------------------------------- item 5


@pytest.fixture(scope="module")
def busy_compare(tmp_path_factory) -> dict:
    """One ``compare --resume --no-pictures`` of methods A and B while another live process (a
    :func:`tests.lock_holder.hold_lock`) holds ``A/seed0``: its exit status, stderr, ``--out`` and
    the tree of ``A/seed0`` before and after. Shared by the two tests below, which only read it
    (built once under ``--dist loadfile``: one worker per module)."""
    base = tmp_path_factory.mktemp("busy")
    out = base / "out"
    dump_yaml(methods_config("A", "B"), base / "C.yaml")
    holder = hold_lock(out / "A" / "seed0")
    try:
        before = tree(out / "A" / "seed0")
        rc, err = _main_stderr(
            ["compare", str(base / "C.yaml"), "--out", str(out), "--resume", "--no-pictures"]
        )
        after = tree(out / "A" / "seed0")
    finally:
        holder.kill()
        holder.wait()
    return {"out": out, "rc": rc, "err": err, "before": before, "after": after}


def _main_stderr(args: list[str]) -> tuple[int, str]:
    """``main(args)`` and what it wrote to stderr: its prints and its log lines (a module-scoped
    fixture has no ``capsys``; the log lines are taken with a root handler in the CLI's format)."""
    with root_log_lines() as stream, contextlib.redirect_stderr(stream):
        rc = main(args)
    return rc, stream.getvalue()


@pytest.mark.slow
@pytest.mark.xdist_group("audit3_busy_compare")
def test_busy_folder_compare_writes_nothing(busy_compare):
    """A compare whose run folder another live process holds: that run is refused (no
    ``failed.json`` in the other process's folder, nothing changed there), the others finish."""
    out, err = busy_compare["out"], busy_compare["err"]
    assert busy_compare["after"] == busy_compare["before"]
    assert f"run A/seed0 refused: {out / 'A' / 'seed0'} is in use by another run" in err
    assert "run A/seed0 failed" not in err
    assert json.loads((out / "B" / "seed0" / "metrics.json").read_text())["status"] == "finished"
    assert not list(out.rglob("failed.json"))


@pytest.mark.slow
@pytest.mark.xdist_group("audit3_busy_compare")
def test_busy_folder_compare_reports_refused(busy_compare):
    out, err = busy_compare["out"], busy_compare["err"]
    assert busy_compare["rc"] == 1 and "1 run(s) refused" in err and "run(s) failed" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == [] and [r["run_id"] for r in summary["refused"]] == ["seed0"]


@pytest.mark.slow  # two commands, each with two spawned workers importing torch
def test_busy_folder_two_compares_jobs_2_on_one_out(tmp_path):
    """Two ``compare --jobs 2`` on one ``--out`` at once: each run is trained by one command and
    refused by the other; no ``failed.json`` anywhere, and the run folders alone summarize to
    four finished runs (the audit: both exit 1, four runs "failed", stale records kept)."""
    cfg = methods_config("A", "B", epochs=4)
    cfg["trainer"]["MetricLossOnly"]["iterations_per_epoch"] = 6
    dump_yaml(cfg, tmp_path / "C.yaml")
    out = tmp_path / "out"
    args = ["compare", str(tmp_path / "C.yaml"), "--jobs", "2", "--seeds", "2", "--out", str(out)]
    args += ["--no-pictures"]  # drawn after the runs by each parent: not what this test checks
    code = f"import sys, tests.tiny; from pml_rank_plugins.cli import main; sys.exit(main({args}))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=400)[1] for p in procs]
    for err in errs:
        assert "Traceback" not in err and "run(s) failed" not in err, err
        assert " failed: " not in err, err
    assert not list(out.rglob("failed.json"))
    summary = summarize_dir(out, write=False)
    assert summary["failed"] == []
    assert {name: row["n_runs"] for name, row in summary["rows"].items()} == {"A": 2, "B": 2}
    for run in out.glob("*/seed*"):
        assert json.loads((run / "metrics.json").read_text())["status"] == "finished"
    # every run was trained by one command; the other one refused it (busy, or already filled)
    # or, having come second to an --out that already held runs, refused everything up front
    # one line per refused run ("run A/seed0 refused: ..."), not the closing "2 run(s) refused"
    refused = sum(len(re.findall(r"\brun \S+/seed\d+ refused: ", e)) for e in errs)
    up_front = sum("already hold runs" in e for e in errs)
    assert refused == 4 or up_front == 1, errs
