"""Config values against a class's declared types (``experiment.argtypes``): what is refused,
and what is left alone (anything the annotation does not pin down)."""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

import pytest
import torch

from pml_rank_plugins.experiment.argtypes import (
    argument_problem,
    check_argument_types,
    fits,
    parse_annotation,
)
from pml_rank_plugins.experiment.errors import ConfigError


def annotated(
    n: int = 1,
    x: float = 0.5,
    flag: bool = False,
    name: str = "a",
    maybe: Optional[int] = None,
    either: "int | str" = 1,
    fn: "Callable[[int], int] | None" = None,
    pair: "tuple[float, float]" = (0.9, 0.99),
    many: "tuple[int, ...]" = (),
    items: "list[int] | None" = None,
    seq: Sequence[str] | None = None,
    tensor: "float | torch.Tensor" = 0.1,
    unknown: "SomeClass" = None,  # noqa: F821 -- an annotation that cannot be resolved
    margin=0.2,
    switch=True,
    mode="all",
    required=inspect.Parameter.empty,
):
    """A signature with one parameter of each kind the checker reads."""


PARAMS = inspect.signature(annotated).parameters


@pytest.mark.parametrize(
    "key, value",
    [
        ("n", "x"),
        ("n", 1.5),
        ("n", True),
        ("x", "0.1"),
        ("x", [0.1]),
        ("x", None),
        ("flag", "yes"),
        ("name", 5),
        ("maybe", "x"),
        ("either", 1.5),
        ("fn", "x"),
        ("fn", 3),
        ("pair", [0.9]),
        ("pair", [0.9, "x"]),
        ("pair", 0.9),
        ("many", [1, "x"]),
        ("items", [1, "x"]),
        ("items", "x"),
        ("tensor", "x"),
        ("margin", "x"),
        ("margin", [1]),
        ("switch", "x"),
    ],
)
def test_values_the_declaration_rules_out(key, value):
    problem = argument_problem(PARAMS[key], value)
    assert problem is not None and problem.startswith("expected"), (key, value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("n", 3),
        ("x", 3),
        ("x", 0.5),
        ("flag", True),
        ("maybe", None),
        ("maybe", 4),
        ("either", "s"),
        ("fn", None),
        ("fn", {"SomeFactory": {}}),  # an object spec: built into an object, not judged here
        ("pair", [0.9, 0.99]),
        ("pair", (0.9, 0.99)),
        ("many", [1, 2, 3]),
        ("items", []),
        ("seq", ["a", "b"]),
        ("tensor", 0.3),
        ("tensor", [1.0]),
        ("unknown", "anything"),
        ("margin", 1),
        ("margin", None),
        ("switch", False),
        ("mode", 5),  # a string default says nothing about what else the class takes
        ("required", None),  # an injected keyword's placeholder
        ("n", torch.tensor(3)),  # objects are not judged
    ],
)
def test_values_it_leaves_alone(key, value):
    assert argument_problem(PARAMS[key], value) is None, (key, value)


def test_a_boolean_for_a_number_says_how_python_reads_it():
    assert "Python would read as 1" in argument_problem(PARAMS["n"], True)


def test_the_error_names_the_key_and_the_declared_type():
    with pytest.raises(ConfigError, match=r"^slot\.Cls\.pair: expected tuple\[float, float\], "):
        check_argument_types(PARAMS.values(), {"n": 1, "pair": [1.0]}, "slot.Cls", ConfigError)


def test_annotations_as_text_and_as_objects_read_alike():
    for text, obj in [("int | None", Optional[int]), ("list[int]", list[int])]:
        for value in (None, 3, "x", [1], ["x"]):
            assert fits(value, parse_annotation(text)) == fits(value, parse_annotation(obj))


def test_unbalanced_or_empty_annotations_say_nothing():
    assert parse_annotation("int |") is None  # gives up rather than guess, never raises
    assert parse_annotation("tuple[int]]") is None
    assert parse_annotation(inspect.Parameter.empty) is None
    assert parse_annotation("") is None
