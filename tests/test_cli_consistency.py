"""``pml-rank`` as one tool (issue 21): every subcommand takes shipped names, ``--data-root``,
``--device`` and ``--allow-module``; the folder policy is the same; ``--help`` and argument
errors answer without importing torch; ``list`` without a match and a missing device say so."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pml_rank_plugins.cli import main
from pml_rank_plugins.cli_args import build_parser as _parser
from pml_rank_plugins.commands import COMMANDS
from tests.data.conftest import shared_dir

DATA_ROOT = shared_dir() / "data"  # the repository's data root: ../shared/data
HEAVY = ("torch", "pytorch_metric_learning", "matplotlib", "scipy")
PROBE = """
import sys, time
t0 = time.perf_counter()
from pml_rank_plugins.cli import main
try:
    main({argv!r})
except SystemExit as e:
    code = e.code
print("EXIT", code, "SECONDS", round(time.perf_counter() - t0, 3))
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize(
    "argv, code",
    [(["--help"], 0)]
    + [([name, "--help"], 0) for name in COMMANDS]
    + [(["train"], 2), (["check", "x", "--jobs"], 2), (["list", "--kind", "loss"], 2)],
)
def test_help_does_not_import_torch(argv, code):
    """`--help` (of the tool and of every command of the table) and argument errors: the parser
    alone, no torch/PML/scipy/matplotlib import."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert f"EXIT {code} SECONDS" in "\n".join(lines), done.stdout + done.stderr
    assert lines[-1] == "HEAVY []", lines[-1]
    seconds = float(lines[-2].split()[-1])
    assert seconds < 1.0, f"{argv}: {seconds} s"


def test_list_without_match_exits_1(capsys):
    assert main(["list", "zzzz"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no name or target contains 'zzzz'" in captured.err


def test_check_default_from_another_folder_with_data_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no configs/ and no ../shared here
    args = ["--data-root", str(DATA_ROOT), "--methods", "plugin FastAP"]
    assert main(["check", "default"] + args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("== ") and out[0].endswith("configs/default.yaml")
    assert out[1].startswith("plugin FastAP: data[")


@pytest.mark.slow  # decodes the Omniglot zip (a few seconds)
def test_omniglot_runs_from_any_folder_under_the_data_root(tmp_path, monkeypatch, capsys):
    """The shipped Omniglot config reads DATA_ROOT/omniglot/images_background_small1.zip; without
    a data root the error names the layout and --data-root."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PML_RANK_DATA", raising=False)
    assert main(["check", "omniglot", "--methods", "plugin FastAP"]) == 2
    err = capsys.readouterr().err
    assert "omniglot/images_background_small1.zip not found" in err
    assert "--data-root DIR" in err and "DIR/omniglot/" in err
    monkeypatch.setenv("PML_RANK_DATA", str(DATA_ROOT))
    assert main(["check", "omniglot", "--methods", "plugin FastAP"]) == 0, capsys.readouterr().err
    assert "plugin FastAP: data[" in capsys.readouterr().out


def test_sweep_accepts_overwrite():
    """The parser only: run_sweep(..., overwrite=) lands with the run-folder policy work."""
    base = ["sweep", "default", "--grid", "trainer.batch_size=32,64"]
    assert _parser().parse_args(base + ["--overwrite"]).overwrite is True
    assert _parser().parse_args(base).overwrite is False
    assert _parser().parse_args(base + ["--resume"]).resume is True


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "default"],
        ["eval", "runs/x"],
        ["compare", "default"],
        ["sweep", "default", "--grid", "seed=1,2"],
        ["check", "default"],
    ],
)
def test_allow_module_flag_is_accepted_everywhere(argv):
    flags = ["--allow-module", "my_project.losses", "--allow-module", "other"]
    args = _parser().parse_args(argv + flags)
    assert args.allow_module == ["my_project.losses", "other"]
    assert _parser().parse_args(argv).allow_module == []
    assert _parser().parse_args(argv + ["--data-root", "d", "--device", "cpu"]).data_root == "d"


@pytest.mark.parametrize("command", [["train", "default"], ["check", "default"], ["eval", "x"]])
def test_device_cuda_without_gpu_is_one_line_exit_2(command, capsys):
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU: absent everywhere
    devices = [missing] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in devices:
        assert main(command + ["--device", device]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"pml-rank: error: --device {device}: not available here")
        assert "available: cpu" in err
    assert main(command + ["--device", "tpu"]) == 2
    assert "--device tpu: not a device; use cpu, cuda, cuda:N or mps" in capsys.readouterr().err
