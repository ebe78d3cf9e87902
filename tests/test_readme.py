"""Every code block of README.md works as written (issue 12, item 15).

Rules (also stated in the README's Quick start):

* ```python blocks run in order in one shared namespace (the Quick start's setup block defines
  ``dataset``, ``model``, ``models``, ``optimizer(s)``, ``images``, ``labels``, ``embeddings``),
  in a temporary working folder;
* ```yaml blocks are configs or config fragments: a fragment is merged over the base of
  ``configs/default.yaml``; each method validates (names, keywords) and its models, losses,
  miners, optimizers, lr schedulers and tester are built (the dataset and sampler are validated
  only, to stay fast);
* ```bash lines (after joining ``\\`` continuations and dropping comments) are ``pml-rank`` /
  ``python -m pml_rank_plugins`` / ``torchrun ... -m pml_rank_plugins`` commands that the real
  argument parser accepts, ``make`` targets the Makefile defines, or ``python``/``PYTHONPATH=.
  python`` scripts that exist; any other command fails (put transcripts in ```text blocks).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from pml_rank_plugins.cli import _parser
from pml_rank_plugins.experiment import builder, registry
from pml_rank_plugins.experiment.schema import (
    TOP_LEVEL_KEYS,
    deep_merge,
    expand_methods,
    load_yaml,
    parse_yaml,
    validate,
)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def blocks(lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of ``lang``."""
    text = README.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == lang
    ]


def test_readme_has_blocks_of_each_kind():
    assert len(blocks("python")) >= 5 and len(blocks("yaml")) >= 2 and len(blocks("bash")) >= 2


@pytest.mark.slow  # about 8 s of CPU: dataset render, one tiny epoch, a chunked step
def test_python_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    try:
        for line, code in blocks("python"):
            try:
                exec(compile(code, f"README.md:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"README.md line {line}: {type(e).__name__}: {e}") from e
    finally:
        for name in ("MyNet",):  # the registration example must not leak into other tests
            registry.unregister(name)


def _base_config() -> dict:
    base = load_yaml(ROOT / "configs" / "default.yaml")
    base.pop("methods", None)
    return base


def _build_cheap_parts(config: dict) -> None:
    """Everything but the dataset and the sampler (validated only): models, losses, miners,
    optimizers, schedulers, the tester."""
    models = builder.build_models(config, torch.device("cpu"))
    losses, _ = builder.build_losses_and_miners(config, torch.device("cpu"))
    optimizers = builder.build_optimizers(config, models, losses)
    builder.build_lr_schedulers(config, optimizers)
    builder.build_tester(config, torch.device("cpu"))


@pytest.mark.parametrize("line, code", blocks("yaml"), ids=lambda v: str(v)[:20])
def test_yaml_blocks_are_valid_configs(line, code):
    data = parse_yaml(code)
    assert isinstance(data, dict), f"README.md line {line}: not a mapping"
    unknown = set(data) - TOP_LEVEL_KEYS
    assert not unknown, f"README.md line {line}: not config keys {unknown} (use a text block)"
    complete = all(k in data for k in ("dataset", "models", "loss_funcs", "trainer"))
    config = data if complete else deep_merge(_base_config(), data)
    for name, cfg in expand_methods(config).items():
        try:
            validate(cfg)
            _build_cheap_parts(cfg)
        except Exception as e:
            raise AssertionError(f"README.md line {line}, {name}: {type(e).__name__}: {e}") from e


def _commands(code: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", code)
    return [c for c in (shlex.split(line, comments=True) for line in joined.splitlines()) if c]


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+)\s*:", (ROOT / "Makefile").read_text(), re.M))


def _parse(argv: list[str], where: str) -> None:
    try:
        _parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"{where}: `pml-rank {shlex.join(argv)}` does not parse") from e


def check_command(argv: list[str], where: str) -> None:
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # leading VAR=value
        argv = argv[1:]
    head = argv[0]
    if head == "pml-rank":
        _parse(argv[1:], where)
    elif head in ("python", "python3") and argv[1:2] == ["-m"]:
        assert argv[2] in ("pml_rank_plugins", "pml_rank_plugins.cli"), where
        _parse(argv[3:], where)
    elif head == "torchrun":
        i = argv.index("-m")
        assert argv[i + 1] in ("pml_rank_plugins", "pml_rank_plugins.cli"), where
        _parse(argv[i + 2 :], where)
    elif head == "make":
        missing = set(argv[1:]) - _makefile_targets()
        assert not missing, f"{where}: no Makefile target {missing}"
    elif head in ("python", "python3"):
        assert (ROOT / argv[1]).is_file(), f"{where}: no script {argv[1]}"
    else:
        raise AssertionError(f"{where}: unchecked command {head!r} (use a text block)")


@pytest.mark.parametrize("line, code", blocks("bash"), ids=lambda v: str(v)[:20])
def test_bash_blocks_are_real_commands(line, code):
    commands = _commands(code)
    assert commands, f"README.md line {line}: empty bash block"
    for argv in commands:
        check_command(argv, f"README.md line {line}")


def test_the_checks_catch_mistakes():
    """The rules above reject what they should (the README's old mistakes)."""
    with pytest.raises(AssertionError, match="does not parse"):
        check_command(shlex.split("pml-rank train default --out x [--resume]"), "t")
    with pytest.raises(AssertionError, match="no Makefile target"):
        check_command(["make", "deploy"], "t")
    with pytest.raises(AssertionError, match="unchecked command"):
        check_command(["curl", "example.org"], "t")
    bad = deep_merge(_base_config(), parse_yaml(
        "loss_funcs: {metric_loss: {pml_rank_plugins.FastAPLoss: {distance: {LpDistance: {}}}}}"
    ))  # fmt: skip
    (cfg,) = expand_methods(bad).values()
    with pytest.raises(ValueError, match="LpDistance"):
        _build_cheap_parts(cfg)
