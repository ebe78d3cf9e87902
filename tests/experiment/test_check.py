"""`pml-rank check`: one summary line per method, exit 0; config mistakes exit 2 with the key."""

from __future__ import annotations

from pathlib import Path

import yaml

from pml_rank_plugins import cli
from pml_rank_plugins.experiment.schema import expand_methods, load_yaml

CONFIGS = Path(cli.__file__).resolve().parent / "experiment" / "configs"


def test_check_prints_one_line_per_method(capsys):
    assert cli.main(["check", str(CONFIGS / "default.yaml")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    methods = expand_methods(load_yaml(CONFIGS / "default.yaml"))
    assert len(lines) == 1 + len(methods)
    assert lines[1].startswith("plugin FastAP: data[train 3640/182c val 1820/91c test 1820/91c]")
    assert "loss[metric_loss=plugin:FastAPLoss]" in lines[1]
    assert "loss[metric_loss=FastAPLoss]" in lines[4] and "trunk=ConvEmbedder(248.9k)" in lines[4]


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_check_reports_config_errors_with_exit_2(tmp_path, capsys):
    cfg = load_yaml(CONFIGS / "default.yaml")
    cfg.pop("methods")
    cfg["loss_funcs"] = {"metric_loss": {"FastAPLos": {}}}
    assert cli.main(["check", _write(tmp_path, cfg)]) == 2
    assert "FastAPLos" in capsys.readouterr().err


def test_missing_data_root_and_env_default(tmp_path, capsys, monkeypatch):
    cfg = load_yaml(CONFIGS / "default.yaml")
    cfg.pop("methods")
    cfg["loss_funcs"] = {"metric_loss": {"ContrastiveLoss": {}}}
    cfg["dataset"] = {"StanfordOnlineProducts": {"root": "Stanford_Online_Products"}}
    path = _write(tmp_path, cfg)
    monkeypatch.setenv("PML_RANK_DATA", str(tmp_path))
    assert cli.main(["check", path]) == 2
    err = capsys.readouterr().err
    assert f"dataset.StanfordOnlineProducts.root: {tmp_path}/Stanford_Online_Products" in err
    assert "Stanford_Online_Products.zip" in err
    assert cli.main(["check", path, "--data-root", str(tmp_path / "nope")]) == 2
    assert "--data-root" in capsys.readouterr().err


def test_check_refuses_a_bad_search_space_naming_the_key(tmp_path, capsys):
    # issue 22: `pml-rank check` validates tune spaces too
    cfg = load_yaml(CONFIGS / "tune_demo.yaml")
    cfg["methods"]["PML FastAP"]["tune"]["space"]["loss_funcs.metric_loss.num_bins"] = {
        "int": [40, 5]
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check", str(path), "--methods", "PML FastAP"]) == 2
    err = capsys.readouterr().err
    assert "tune.space.loss_funcs.metric_loss.num_bins" in err and "low 40 > high 5" in err
