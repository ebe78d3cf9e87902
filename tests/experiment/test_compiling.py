"""``trainer.compile`` values: parsed into ``torch.compile``'s keywords, or refused naming the key
(``experiment/compiling.py``); checked with the rest of the config (``check == train``)."""

from __future__ import annotations

import pytest

from pml_rank_plugins.experiment import ConfigError, RunSpec, validate
from pml_rank_plugins.experiment.compiling import CompileSettings, parse_compile
from tests.tiny import tiny_config


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        (False, None),
        (True, CompileSettings("inductor", None, False, None)),
        ({}, CompileSettings()),
        ({"backend": "aot_eager"}, CompileSettings("aot_eager")),
        ({"mode": "reduce-overhead"}, CompileSettings(mode="reduce-overhead")),
        ({"fullgraph": True, "dynamic": False}, CompileSettings(fullgraph=True, dynamic=False)),
    ],
)
def test_accepted_values(value, expected):
    assert parse_compile(value) == expected


def test_the_settings_are_torch_compile_keywords():
    kwargs = CompileSettings("aot_eager", None, True, None).kwargs()
    assert kwargs == {"backend": "aot_eager", "mode": None, "fullgraph": True, "dynamic": None}


@pytest.mark.parametrize(
    "value, message",
    [
        ("yes", r"trainer\.compile: expected true, false or a mapping"),
        (1, r"trainer\.compile: expected true, false or a mapping"),
        ([True], r"trainer\.compile: expected true, false or a mapping"),
        ({"backnd": "eager"}, r"trainer\.compile: unknown key\(s\) \['backnd'\]"),
        ({"backend": "tensorrt9"}, r"trainer\.compile\.backend: unknown torch.compile backend"),
        ({"backend": 3}, r"trainer\.compile\.backend: unknown"),
        ({"mode": "fastest"}, r"trainer\.compile\.mode: unknown torch.compile mode 'fastest'"),
        (
            {"backend": "aot_eager", "mode": "reduce-overhead"},
            r"trainer\.compile\.mode: 'reduce-overhead' is an inductor mode, but the backend",
        ),
        ({"fullgraph": "yes"}, r"trainer\.compile\.fullgraph: expected true or false"),
        ({"fullgraph": 1}, r"trainer\.compile\.fullgraph: expected true or false"),
        ({"dynamic": "auto"}, r"trainer\.compile\.dynamic: expected true or false or null"),
    ],
)
def test_bad_values_are_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message):
        parse_compile(value)


def test_validate_checks_the_key_under_the_trainer_spec():
    cfg = tiny_config(trainer={"MetricLossOnly": {"compile": {"fullgraph": "yes"}}})
    with pytest.raises(ConfigError, match=r"trainer\.MetricLossOnly\.compile\.fullgraph"):
        validate(cfg)
    cfg = tiny_config(trainer={"MetricLossOnly": {"compile": {"backend": "aot_eager"}}})
    spec = RunSpec.parse(cfg)  # a runner keyword: not passed to (nor checked against) PML's trainer
    assert spec.trainer.compile == {"backend": "aot_eager"} and "compile" not in spec.trainer.kwargs
