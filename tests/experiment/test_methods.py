"""Methods of a comparison: names that map to one run folder (issue 20, R2) or to no safe folder
(issue 28 item 1: ``..``, ``a/b``, control characters) are a config error."""

from __future__ import annotations

import re

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.methods import check_folders, collect_methods, folder_problem, slug
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
    dump_yaml(tiny_config(name="FastAP:a"), two)
    with pytest.raises(ConfigError, match="'FastAP a' and 'FastAP:a'"):
        collect_methods([one, two])
    out = tmp_path / "runs"
    assert main(["compare", str(one), str(two), "--out", str(out)]) == 2
    assert "both map to the run folder 'FastAP_a'" in capsys.readouterr().err
    assert not out.exists() or not any(out.rglob("metrics.json"))


def test_distinct_method_folders_pass_and_selection_checks_only_the_selected():
    assert list(collect_methods(two_methods("FastAP a", "FastAP b"))) == ["FastAP a", "FastAP b"]
    cfg = two_methods("FastAP a", "FastAP_a")
    assert list(collect_methods(cfg, methods=["FastAP a"])) == ["FastAP a"]


# Names that slugged to ".." or "." and left --out (issue 28 item 1), and other unsafe names.
ESCAPING = ["..", ".", " .. ", ".._", "..\x00", "...", "_.._"]
UNSAFE = ["", "  ", "/", "a/b", "..\\x", "a\\b", "a\x01b", "tab\tname", "nul\x00", ".hidden"]


@pytest.mark.parametrize("name", ESCAPING + UNSAFE)
def test_slug_is_never_empty_or_dots(name):
    folder = slug(name)
    assert folder and folder.strip(".") and "/" not in folder and "\\" not in folder
    assert all(c.isalnum() or c in "_.+-" for c in folder), folder


@pytest.mark.parametrize("name", ESCAPING + UNSAFE)
def test_unsafe_method_names_are_a_config_error_naming_the_method(name):
    assert folder_problem(name) is not None
    with pytest.raises(ConfigError, match=rf"^method {re.escape(repr(name))}: not a safe run "
                       r"folder name: .*; rename it .*\(e\.g\. '[A-Za-z0-9_+-]+'\)$"):  # fmt: skip
        check_folders(["ok", name])
    with pytest.raises(ConfigError, match=re.escape(repr(name))):
        collect_methods(two_methods(name, "x"))


def test_folder_problem_says_why():
    assert "'..': dots only" in folder_problem("..")
    assert "'..': dots only" in folder_problem(".._")  # slugs to '..'
    assert "which" not in folder_problem("") and "empty" in folder_problem("")
    assert "path separator" in folder_problem("a/b")
    assert "control character" in folder_problem("a\x1bb")
    assert "hidden" in folder_problem(".x")
    for fine in ("FastAP a", "plugin RankedList", "M=64 x 160 updates", "m=0.4 Tn=10 (paper)",
                 "mAP_Q balanced (paper)", "a.b", "x+y-z", "Ünïcode"):  # fmt: skip
        assert folder_problem(fine) is None, fine


def test_non_strict_check_allows_slugged_values_but_not_dots():
    check_folders(["path=a/b", "lr=1e-3"], kind="run", strict=False)  # sweep cells: values
    with pytest.raises(ConfigError, match="^run '..': not a safe run folder name"):
        check_folders([".."], kind="run", strict=False)
    with pytest.raises(ConfigError, match="runs 'path=a/b' and 'path=a b' both map"):
        check_folders(["path=a/b", "path=a b"], kind="run", strict=False)


def test_names_differing_in_case_only_are_a_config_error():
    with pytest.raises(ConfigError, match=r"methods 'FastAP' and 'fastap' both map to the run "
                       r"folders 'FastAP' and 'fastap', one folder where case is ignored"):  # fmt: skip
        collect_methods(two_methods("FastAP", "fastap"))


@pytest.mark.parametrize("command", ["check", "train", "compare", "sweep", "tune"])
def test_every_command_refuses_a_dotdot_method_before_writing(tmp_path, capsys, command):
    cfg = two_methods("..", "x")
    path = tmp_path / "p" / "C.yaml"
    path.parent.mkdir()
    dump_yaml(cfg, path)
    out = tmp_path / "p" / "runs"
    args = {
        "check": ["check", str(path)],
        "train": ["train", str(path), "--out", str(out), "--overwrite"],
        "compare": ["compare", str(path), "--out", str(out)],
        "sweep": ["sweep", str(path), "--method", "..", "--grid", "seed=1,2", "--out", str(out)],
        "tune": ["tune", str(path), "--out", str(out), "--trials", "1"],
    }[command]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pml-rank: config error: method '..': not a safe run folder name" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in path.parent.iterdir()) == ["C.yaml"]
