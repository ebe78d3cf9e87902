"""Methods of a comparison: names that map to one run folder are a config error (issue 20, R2)."""

from __future__ import annotations

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.methods import collect_methods, slug
from pml_rank_plugins.experiment.schema import ConfigError, dump_yaml
from tests.tiny import tiny_config


def two_methods(a: str, b: str) -> dict:
    cfg = tiny_config()
    cfg.pop("name")
    cfg["methods"] = {a: {}, b: {"seed": 1}}
    return cfg


def test_R2_colliding_method_folders_are_a_config_error(tmp_path, capsys):
    assert slug("FastAP a") == slug("FastAP_a") == "FastAP_a"
    with pytest.raises(ConfigError, match=r"'FastAP a' and 'FastAP_a' both map to the run folder "
                       r"'FastAP_a'.*rename one"):  # fmt: skip
        collect_methods(two_methods("FastAP a", "FastAP_a"))
    # across files too, and through the CLI before anything trains (exit 2)
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    dump_yaml(tiny_config(name="FastAP a"), one)
    dump_yaml(tiny_config(name="FastAP/a"), two)
    with pytest.raises(ConfigError, match="'FastAP a' and 'FastAP/a'"):
        collect_methods([one, two])
    out = tmp_path / "runs"
    assert main(["compare", str(one), str(two), "--out", str(out)]) == 2
    assert "both map to the run folder 'FastAP_a'" in capsys.readouterr().err
    assert not out.exists() or not any(out.rglob("metrics.json"))


def test_distinct_method_folders_pass_and_selection_checks_only_the_selected():
    assert list(collect_methods(two_methods("FastAP a", "FastAP b"))) == ["FastAP a", "FastAP b"]
    cfg = two_methods("FastAP a", "FastAP_a")
    assert list(collect_methods(cfg, methods=["FastAP a"])) == ["FastAP a"]
