"""S1 (issue 20): configs name classes, not arbitrary callables.

A dotted path resolves only inside the known namespaces or a module the user allowed outside the
config (``registry.allow_modules``, ``--allow-module``, ``$PML_RANK_ALLOW_MODULES``); ``os``,
``subprocess``, ``builtins``... never. Refused names are exit 2 naming the config key.
"""

from __future__ import annotations

import pytest
import yaml

from pml_rank_plugins import cli
from pml_rank_plugins.experiment import allowlist, registry
from pml_rank_plugins.experiment.registry import ALLOW_ENV, UnknownNameError
from pml_rank_plugins.running import train
from tests.tiny import TinyNet, tiny_config


@pytest.fixture(autouse=True)
def _no_allowance(monkeypatch):
    """Each test starts with nothing allowed; allow_modules' writes to os.environ are undone."""
    monkeypatch.setattr(allowlist, "_ALLOWED", [])
    monkeypatch.delenv(ALLOW_ENV, raising=False)


def _write(path, cfg) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize(
    "key, spec",
    [
        ("dataset", {"subprocess.run": {"args": "id > {FILE}", "shell": True}}),
        ("models.trunk", {"os.system": {"command": "id > {FILE}"}}),
        ("loss_funcs.metric_loss", {"builtins.exec": {"source": "open('{FILE}', 'w')"}}),
    ],
)
def test_S1_subprocess_run_in_a_config_is_refused(tmp_path, capsys, key, spec, monkeypatch):
    marker = tmp_path / "pwned"
    spec = yaml.safe_load(yaml.safe_dump(spec).replace("{FILE}", str(marker)))
    cfg = tiny_config()
    section, _, sub = key.partition(".")
    if sub:
        cfg[section][sub] = spec
    else:
        cfg[section] = spec
    path = _write(tmp_path / "c.yaml", cfg)
    assert cli.main(["check", path]) == 2
    err = capsys.readouterr().err
    assert f"{key}: " in err and "never be named" in err
    assert not marker.exists()
    # An allowance cannot lift the deny list, and train --set is refused the same way.
    monkeypatch.setenv(ALLOW_ENV, "my_pkg")
    value = yaml.safe_dump(spec, default_flow_style=True).strip()
    argv = ["train", _write(tmp_path / "ok.yaml", tiny_config()), "--set", f"{key}={value}"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert f"{key}: " in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_S1_eval_of_an_edited_run_config_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}}), run)
    marker = tmp_path / "pwned"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["models"]["trunk"] = {"os.system": {"command": f"id > {marker}"}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert cli.main(["eval", str(run)]) == 2
    assert "models.trunk: 'os.system' is refused" in capsys.readouterr().err
    assert not marker.exists()


def _user_package(tmp_path, monkeypatch, name: str) -> None:
    """``name.nets`` with a model class, ``os.system`` re-exported, and an import side effect."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(
        "from os import system\nimport torch\n\n\nclass Net(torch.nn.Linear):\n"
        "    def __init__(self, n=4):\n        super().__init__(n, n)\n"
    )
    (pkg / "side_effect.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_S1_other_modules_need_an_allowance_api(tmp_path, monkeypatch):
    _user_package(tmp_path, monkeypatch, "s1_api_pkg")
    with pytest.raises(UnknownNameError) as info:
        registry.resolve("s1_api_pkg.nets.Net", "models.trunk")
    msg = str(info.value)
    assert msg.startswith("models.trunk: ") and "--allow-module my_pkg" in msg
    assert f"{ALLOW_ENV}=my_pkg" in msg
    with pytest.raises(UnknownNameError, match="not allowed"):
        registry.resolve("s1_api_pkg.side_effect.x")
    assert not (tmp_path / "imported").exists()  # refused before importing
    registry.allow_modules(["s1_api_pkg"])
    assert registry.allowed_modules() == ("s1_api_pkg",)
    assert ALLOW_ENV in __import__("os").environ  # spawn workers inherit it
    assert __import__("os").environ[ALLOW_ENV] == "s1_api_pkg"
    assert registry.resolve("s1_api_pkg.nets.Net").__name__ == "Net"
    # Re-exported from a denied module: refused by where it is defined, allowance or not.
    with pytest.raises(UnknownNameError, match="defined in module 'posix'"):
        registry.resolve("s1_api_pkg.nets.system")
    # A prefix allows submodules, not other names sharing its first letters.
    with pytest.raises(UnknownNameError, match="not allowed"):
        registry.resolve("s1_api_pkgx.nets.Net")


def test_S1_other_modules_need_an_allowance_env(tmp_path, monkeypatch, capsys):
    _user_package(tmp_path, monkeypatch, "s1_env_pkg")
    cfg = tiny_config(models={"trunk": None})
    cfg["models"]["trunk"] = {"s1_env_pkg.nets.Net": {"n": 64}}
    path = _write(tmp_path / "c.yaml", cfg)
    assert cli.main(["check", path]) == 2
    err = capsys.readouterr().err
    assert "models.trunk: 's1_env_pkg.nets.Net' is not allowed" in err
    assert "--allow-module my_pkg" in err
    monkeypatch.setenv(ALLOW_ENV, "other, s1_env_pkg")  # read at each resolve
    assert registry.allowed_modules() == ("other", "s1_env_pkg")
    assert cli.main(["check", path]) == 0
    assert "trunk=Net(" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["os", "os.path", "subprocess", "builtins", "sys", "pickle"])
def test_S1_deny_list_cannot_be_lifted(name, monkeypatch):
    with pytest.raises(ValueError, match="cannot be allowed"):
        registry.allow_modules([name])
    assert registry.allowed_modules() == ()
    monkeypatch.setenv(ALLOW_ENV, name)
    with pytest.raises(UnknownNameError, match=f"{ALLOW_ENV}: module '{name}' cannot be allowed"):
        registry.resolve("my_pkg.Thing", "dataset")


def test_S1_known_namespaces_keep_working():
    from pml_rank_plugins.data.splits import query_gallery_split

    assert registry.resolve("pml_rank_plugins.data.splits.query_gallery_split") is (
        query_gallery_split
    )
    assert registry.resolve("torchvision.transforms.Resize").__name__ == "Resize"
    registry.register("S1TinyNet", TinyNet, override=True)  # Python-side registration: trusted
    assert registry.resolve("S1TinyNet") is TinyNet
    removed_alias = "pml_rank_plugins.config.splits.query_gallery_split"  # the 0.x alias package
    for name in ("torch.load", "torch.hub.load", "pml_rank_plugins.cli.main", removed_alias):
        with pytest.raises(UnknownNameError, match="not allowed|refused"):
            registry.resolve(name)
