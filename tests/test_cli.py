"""``pml-rank`` end to end on the registered stand-ins: compare, train, eval, list."""

from __future__ import annotations

import csv
import json

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.config.schema import dump_yaml
from tests.config.standins import tiny_config


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
          "--set", "trainer.iterations_per_epoch=2"])  # fmt: skip
    again = json.loads((out / "summary.json").read_text())
    assert again["rows"]["PML Contrastive"]["mean_average_precision_at_r"] == (
        summary["rows"]["PML Contrastive"]["mean_average_precision_at_r"]
    )


def test_train_resume_and_eval(tmp_path, config_file, capsys):
    run = tmp_path / "one"
    args = ["train", str(config_file), "--method", "PML MultiSimilarity", "--out", str(run)]
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
    args = ["train", str(config_file), "--set", "loss_funcs.metric_loss={ContrastivLoss: {}}"]
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
    args = ["compare", str(broken), "--out", str(tmp_path / "sub"), "--methods", "PML Contrastive"]
    assert main(args + ["--set", "trainer.num_epochs=1"]) == 0
