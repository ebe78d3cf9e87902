"""Duplicate YAML keys are refused (third audit, item 12: PyYAML kept the last one silently)."""

from __future__ import annotations

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.experiment.yamlfile import parse_yaml


def test_a_key_given_twice_is_refused_naming_both_lines():
    with pytest.raises(ConfigError) as e:
        parse_yaml("seed: 0\ntrainer:\n  lr: 1\n  lr: 2\n", "c.yaml")
    assert "c.yaml: line 4" in str(e.value) and "'lr' given twice" in str(e.value)
    assert "first at line 3" in str(e.value)


def test_the_same_key_in_two_mappings_and_merge_keys_are_fine():
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    merged = parse_yaml("base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n")
    assert merged["d"] == {"x": 1, "y": 2}


def test_check_exits_2_on_a_duplicate_key(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 0\nseed: 1\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'seed' given twice" in err and len(err.strip().splitlines()) == 1
