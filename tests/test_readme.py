"""Every code block of README.md and of every docs page works as written (issue 12, item 15;
issue 19, item 7).

The files checked are README.md and every ``docs/**/*.md`` page (``docs/_build`` excluded), each
file separately (tests are parametrized per file or per block, ids ``<file>:<line>``). Rules (also
stated in the README's Quick start and on docs/getting-started.md):

* ```python blocks of one file run in order in one shared namespace, in a temporary working
  folder. README.md's first python block is the Quick start's setup block (it defines
  ``dataset``, ``model``, ``models``, ``optimizer(s)``, ``images``, ``labels``, ``embeddings``);
  for a docs page the namespace starts from that setup block, run first, and every other name a
  page uses is defined on that page;
* ```yaml blocks are configs or config fragments: a fragment is merged over the base of
  ``configs/default.yaml``; each method validates (names, keywords) and its models, losses,
  miners, optimizers, lr schedulers and tester are built (the dataset and sampler are validated
  only, to stay fast);
* ```bash lines (after joining ``\\`` continuations and dropping comments) are ``pml-rank`` /
  ``python -m pml_rank_plugins`` / ``torchrun ... -m pml_rank_plugins`` commands that the real
  argument parser accepts, ``make`` targets the Makefile defines, or ``python``/``PYTHONPATH=.
  python`` scripts that exist, or scripts of the repository run directly
  (``scripts/run_ablations.sh``); any other command fails.

There is no silent skip: a block that must not be checked (a transcript, program output, a
command for another machine that the parser cannot accept) is written as a ```text block, which
these tests do not read.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from pytorch_metric_learning.trainers import BaseTrainer

from pml_rank_plugins.cli_args import build_parser as _parser
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
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def doc_files() -> list[Path]:
    """README.md, then every Markdown page of the docs site (not the build output)."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    return [README, *pages]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(lang: str, path: Path = README) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of ``lang`` in ``path``."""
    text = path.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == lang
    ]


def block_params(lang: str) -> list:
    """One ``pytest.param(where, code)`` per ``lang`` block of every file, id ``<file>:<line>``."""
    return [
        pytest.param(f"{_name(path)} line {line}", code, id=f"{_name(path)}:{line}")
        for path in doc_files()
        for line, code in blocks(lang, path)
    ]


def _files_with(lang: str) -> list:
    return [pytest.param(p, id=_name(p)) for p in doc_files() if blocks(lang, p)]


def setup_block() -> str:
    """The Quick start's setup block: README.md's first python block."""
    return blocks("python")[0][1]


def test_readme_has_blocks_of_each_kind():
    assert len(blocks("python")) >= 2 and len(blocks("yaml")) >= 1 and len(blocks("bash")) >= 2
    assert "dataset = GlyphDataset(" in setup_block()
    every = {lang: sum(len(blocks(lang, p)) for p in doc_files()) for lang in ("python", "yaml")}
    assert every["python"] >= 5 and every["yaml"] >= 2, every


def test_docs_pages_are_found():
    names = {_name(p) for p in doc_files()}
    assert {"docs/index.md", "docs/getting-started.md", "docs/api/index.md"} <= names, names


@pytest.mark.slow  # seconds of CPU per file: dataset render, a tiny epoch, a chunked step
@pytest.mark.parametrize("path", _files_with("python"))
def test_python_blocks_run_in_order(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    code_blocks = [(f"{_name(path)} line {line}", code) for line, code in blocks("python", path)]
    if path != README:  # a docs page starts from the Quick start's setup block
        code_blocks.insert(0, ("README.md setup block", setup_block()))
    ran = []
    try:
        for where, code in code_blocks:
            try:
                exec(compile(code, where.replace(" line ", ":"), "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e
            ran.append(where)
        assert ran and len(ran) == len(code_blocks)
    finally:
        for name in ("MyNet",):  # the registration example must not leak into other tests
            registry.unregister(name)
        # A PML trainer keeps its data-loader iterator in a reference cycle; left to the cyclic
        # garbage collector, its loader workers (PML's default: 2) wait out the join timeout,
        # 10 s of a later test. Dropped here, they shut down at once (what a page ran is done).
        for value in namespace.values():
            if isinstance(value, BaseTrainer):
                value.dataloader_iter = None


def _base_config() -> dict:
    """``configs/default.yaml`` as its first method (so a fragment without ``loss_funcs``, such
    as a ``compare:`` section, still makes a whole config)."""
    first = next(iter(expand_methods(load_yaml(ROOT / "configs" / "default.yaml")).values()))
    first.pop("name", None)
    return first


def _build_cheap_parts(config: dict) -> None:
    """Everything but the dataset and the sampler (validated only): models, losses, miners,
    optimizers, schedulers, the tester."""
    models = builder.build_models(config, torch.device("cpu"))
    losses, _ = builder.build_losses_and_miners(config, torch.device("cpu"))
    optimizers = builder.build_optimizers(config, models, losses)
    builder.build_lr_schedulers(config, optimizers)
    builder.build_tester(config, torch.device("cpu"))


@pytest.mark.parametrize("where, code", block_params("yaml"))
def test_yaml_blocks_are_valid_configs(where, code):
    data = parse_yaml(code)
    assert isinstance(data, dict), f"{where}: not a mapping"
    unknown = set(data) - TOP_LEVEL_KEYS
    assert not unknown, f"{where}: not config keys {unknown} (use a text block)"
    complete = all(k in data for k in ("dataset", "models", "loss_funcs", "trainer"))
    config = data if complete else deep_merge(_base_config(), data)
    for name, cfg in expand_methods(config).items():
        try:
            validate(cfg)
            _build_cheap_parts(cfg)
        except Exception as e:
            raise AssertionError(f"{where}, {name}: {type(e).__name__}: {e}") from e


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
    elif "/" in head and not head.startswith("/"):  # a repository script run directly
        script = ROOT / head
        assert script.is_file(), f"{where}: no script {head}"
        assert os.access(script, os.X_OK), f"{where}: {head} is not executable"
    else:
        raise AssertionError(f"{where}: unchecked command {head!r} (use a text block)")


@pytest.mark.parametrize("where, code", block_params("bash"))
def test_bash_blocks_are_real_commands(where, code):
    commands = _commands(code)
    assert commands, f"{where}: empty bash block"
    for argv in commands:
        check_command(argv, where)


@pytest.mark.parametrize("lang", ["sh", "shell", "console", "py", "python3", "yml"])
def test_no_block_escapes_the_checks_by_its_language_name(lang):
    """A synonym of a checked language would not be run: use the checked name or ``text``."""
    found = [f"{_name(p)}:{line}" for p in doc_files() for line, _ in blocks(lang, p)]
    assert not found, f"```{lang} blocks are not checked; write python/yaml/bash or text: {found}"


def test_the_checks_catch_mistakes():
    """The rules above reject what they should (the README's old mistakes)."""
    with pytest.raises(AssertionError, match="does not parse"):
        check_command(shlex.split("pml-rank train default --out x [--resume]"), "t")
    with pytest.raises(AssertionError, match="no Makefile target"):
        check_command(["make", "deploy"], "t")
    with pytest.raises(AssertionError, match="unchecked command"):
        check_command(["curl", "example.org"], "t")
    with pytest.raises(AssertionError, match="no script"):
        check_command(["scripts/no_such_script.sh"], "t")
    bad = deep_merge(_base_config(), parse_yaml(
        "loss_funcs: {metric_loss: {pml_rank_plugins.FastAPLoss: {distance: {LpDistance: {}}}}}"
    ))  # fmt: skip
    (cfg,) = expand_methods(bad).values()
    with pytest.raises(ValueError, match="LpDistance"):
        _build_cheap_parts(cfg)


def test_quick_start_trains_with_class_balanced_batches_and_pml_optimizer_names():
    """Issue 41: a ranking loss on random batches of a many-class set has few queries with a
    positive, and PML warns about a missing ``embedder_optimizer``."""
    setup, trainer = blocks("python")[0][1], blocks("python")[1][1]
    assert '"trunk_optimizer"' in setup and '"embedder_optimizer"' in setup
    assert "MPerClassSampler" in trainer and "sampler=sampler" in trainer
    getting_started = DOCS / "getting-started.md"
    assert setup in getting_started.read_text() and trainer in getting_started.read_text()


@pytest.mark.slow  # one tiny epoch
def test_quick_start_runs_without_pml_warnings(tmp_path, monkeypatch, caplog):
    import warnings

    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _, code in blocks("python")[:2]:
            exec(compile(code, "README.md", "exec"), namespace)
    namespace["trainer"].dataloader_iter = None
    pml = [r.getMessage() for r in caplog.records if r.name.startswith("PML")]
    assert not [m for m in pml if "optimizer" in m], pml
    # PML's trainer formats the loss tensor into its progress bar: torch's one warning about it
    # comes from PML's code, not from the quick start.
    ours = [
        str(w.message)
        for w in caught
        if "Converting a tensor with requires_grad" not in str(w.message)
    ]
    assert not ours, ours
