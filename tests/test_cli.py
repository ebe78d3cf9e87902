"""``pml-rank`` end to end on a tiny registered dataset/model: compare, train, eval, list."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.cli_args import build_parser as _parser
from pml_rank_plugins.experiment.schema import dump_yaml
from tests.tiny import tiny_config


@pytest.fixture
def config_file(tmp_path):
    cfg = tiny_config()
    cfg["methods"] = {
        "PML Contrastive": None,
        "PML Triplet + miner": {
            "loss_funcs": {"metric_loss": {"TripletMarginLoss": {"margin": 0.1}}},
            "mining_funcs": {"tuple_miner": {"TripletMarginMiner": {"margin": 0.1}}},
        },
        "PML MultiSimilarity": {"loss_funcs": {"metric_loss": {"MultiSimilarityLoss": {}}}},
    }
    path = tmp_path / "tiny.yaml"
    dump_yaml(cfg, path)
    return path


@pytest.mark.slow
def test_compare_writes_table_csv_plots_and_runs(tmp_path, config_file, capsys):
    out = tmp_path / "cmp"
    rc = main(
        [
            "compare",
            str(config_file),
            "--seeds",
            "2",
            "--out",
            str(out),
            "--methods",
            "PML Contrastive,PML Triplet + miner",
            "--set",
            "trainer.iterations_per_epoch=2",
            "--no-pictures",  # the retrieval pictures: tests/reporting/test_retrieval.py
        ]
    )
    assert rc == 0
    table = (out / "comparison.md").read_text()
    assert "| method | n | P@1 | RP | MAP@R | R@1 | R@2 | R@4 | time/run (s) |" in table
    assert "PML Contrastive" in table and "PML Triplet + miner" in table
    assert "MultiSimilarity" not in table
    assert table in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "comparison.csv")))
    assert [r["method"] for r in rows] == ["PML Contrastive", "PML Triplet + miner"]
    assert all(r["n_runs"] == "2" and r["n_failed"] == "0" for r in rows)
    for png in ("val_map_at_r.png", "recall_at_k.png"):
        assert (out / png).stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    for row in summary["rows"].values():
        vals = row["mean_average_precision_at_r"]["values"]
        assert len(vals) == 2 and all(0.0 <= v <= 1.0 for v in vals)
        mean = sum(vals) / 2
        assert row["mean_average_precision_at_r"]["mean"] == pytest.approx(mean)
    for d in ("PML_Contrastive/seed0", "PML_Triplet_+_miner/seed1"):
        run = out / d
        assert (run / "checkpoints" / "latest.pt").is_file()
        assert (run / "logs" / "logs.db").is_file()
        m = json.loads((run / "metrics.json").read_text())
        assert m["seed"] == (0 if d.endswith("seed0") else 1)
        assert len(m["history"]) == 2
    # --resume reuses finished runs: same table.
    main(["compare", str(config_file), "--seeds", "2", "--out", str(out), "--resume",
          "--methods", "PML Contrastive,PML Triplet + miner",
          "--set", "trainer.iterations_per_epoch=2", "--no-pictures"])  # fmt: skip
    again = json.loads((out / "summary.json").read_text())
    assert again["rows"]["PML Contrastive"]["mean_average_precision_at_r"] == (
        summary["rows"]["PML Contrastive"]["mean_average_precision_at_r"]
    )


def test_train_resume_and_eval(tmp_path, config_file, capsys):
    run = tmp_path / "one"
    args = [
        "train",
        str(config_file),
        "--method",
        "PML MultiSimilarity",
        "--out",
        str(run),
    ]
    assert main(args + ["--set", "trainer.num_epochs=1"]) == 0
    assert json.loads((run / "metrics.json").read_text())["epochs_run"] == 1
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["checkpoint"] == "best.pt" and "test" in printed and "val" in printed
    assert (run / "eval.json").is_file()


def test_list_shows_resolution(capsys):
    assert main(["list", "TripletMargin"]) == 0
    out = capsys.readouterr().out
    assert "TripletMarginLoss" in out and "pytorch_metric_learning" in out


def test_config_mistakes_exit_2_with_a_clear_message(tmp_path, config_file, capsys):
    assert main(["compare", str(config_file), "--methods", "Nope", "--out", str(tmp_path)]) == 2
    assert "unknown ['Nope']" in capsys.readouterr().err
    args = [
        "train",
        str(config_file),
        "--set",
        "loss_funcs.metric_loss={ContrastivLoss: {}}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "config error: unknown name 'ContrastivLoss'" in err and "ContrastiveLoss" in err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    capsys.readouterr()
    # A method naming a missing class does not block running the others.
    broken = tmp_path / "broken.yaml"
    text = config_file.read_text().replace("MultiSimilarityLoss", "NotInstalledLoss")
    broken.write_text(text)
    assert main(["compare", str(broken), "--out", str(tmp_path / "all")]) == 2
    assert "NotInstalledLoss" in capsys.readouterr().err
    args = [
        "compare",
        str(broken),
        "--out",
        str(tmp_path / "sub"),
        "--methods",
        "PML Contrastive",
    ]
    assert main(args + ["--set", "trainer.num_epochs=1", "--no-pictures"]) == 0


def test_list_shows_the_plugins_classes_with_the_name_to_use(capsys):
    assert main(["list", "FastAP"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "losses:"
    names = [line.split()[0] for line in lines[1:]]
    assert names == ["FastAPLoss", "pml_rank_plugins.FastAPLoss"]
    assert lines[2].split()[1] == "pml_rank_plugins.losses.fastap.FastAPLoss"


def _cli(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "pml_rank_plugins", *args],
        capture_output=True,
        text=True,
        **kwargs,
    )


@pytest.mark.slow
def test_python_dash_m_and_a_closed_pipe():
    done = _cli("list", "TripletMargin")
    assert done.returncode == 0 and "TripletMarginLoss" in done.stdout
    # `pml-rank list | head`: the reader goes away; no BrokenPipeError traceback.
    p = subprocess.Popen(
        [sys.executable, "-m", "pml_rank_plugins", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode in (0, 1)


def test_every_argument_has_help_with_an_example():
    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for choice in subparsers._choices_actions:
        assert "e.g." in choice.help, choice.dest
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.dest)
            if action.nargs != 0:  # takes a value: show one
                assert "e.g." in action.help, (name, action.dest)


def test_shipped_config_by_name(tmp_path, monkeypatch, capsys):
    """`pml-rank train default ...` from a folder without configs/; an unknown name lists them."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "nope: no such file and no shipped config" in err and "default, omniglot" in err
    # `default` resolves and validates (a method name that does not exist shows it got there).
    assert main(["train", "default", "--method", "Nope"]) == 2
    assert "unknown ['Nope']" in capsys.readouterr().err
