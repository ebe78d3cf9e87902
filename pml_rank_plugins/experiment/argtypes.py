"""Config values checked against the types a class declares, before the object is built.

A constructor often stores a keyword and uses it only in ``forward`` or when sampling:
``TripletMarginMiner(margin="x")`` and Optuna's ``TPESampler(gamma="x")`` build fine, and the run
fails (or every trial fails) much later. :func:`check_argument_types` compares each value a config
gives with what the class declares for that keyword:

* its annotation (a type object or a string, as ``from __future__ import annotations`` leaves
  it): ``int``, ``float``, ``bool``, ``str``, ``None``, unions (``X | Y``, ``Optional``,
  ``Union``), ``Callable``, paths, and sequences (``list[X]``, ``tuple[X, Y]`` with its length,
  ``tuple[X, ...]``) and mappings;
* else its default: a numeric default (``margin=0.2``) asks for a number, a boolean default for a
  boolean.

Only the values YAML can give are judged (``None``, booleans, numbers, strings, lists); mappings
are left alone (an object spec becomes an object), and so is anything the annotation does not
pin down (an unknown class name, ``Any``, ``Literal``, ``torch.Tensor``...): the check refuses
only what the class certainly cannot take. ``True`` for an ``int``/``float`` is refused too
(Python would read it as 1).

Cost: O(size of the annotation + size of the value) per keyword.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Iterable

_TOKEN = re.compile(r"\s*(?:([A-Za-z_][\w.]*)|(\.\.\.)|('[^']*'|\"[^\"]*\"|-?\d[\w.+-]*)|(.))")
_SEQUENCES = {"list", "List", "tuple", "Tuple", "set", "Set", "frozenset", "FrozenSet"}
_SEQUENCE_ABCS = {"Sequence", "MutableSequence", "Iterable", "Collection", "AbstractSet"}
_MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict"}
_PATHS = {"Path", "PurePath", "PathLike"}
_ARRAYS = {"Tensor", "ndarray"}
# An annotation node: (name, args) with args None for a bare name, or ("|", [arms]).
Node = tuple


class _Parser:
    """A small recursive-descent parser for annotation text (``tuple[float | Tensor, float]``)."""

    def __init__(self, text: str) -> None:
        self.tokens = [m.group(0).strip() for m in _TOKEN.finditer(text) if m.group(0).strip()]
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def union(self) -> Node:
        arms = [self.term()]
        while self.peek() == "|":
            self.take()
            arms.append(self.term())
        return arms[0] if len(arms) == 1 else ("|", arms)

    def term(self) -> Node:
        token = self.take()
        if token == "[":  # Callable's parameter list
            args = self.args("]")
            return ("[]", args)
        if self.peek() == "[":
            self.take()
            return (token, self.args("]"))
        return (token, None)

    def args(self, close: str) -> list[Node]:
        out: list[Node] = []
        while self.peek() not in (close, None):
            out.append(self.union())
            if self.peek() == ",":
                self.take()
        if self.peek() == close:
            self.take()
        return out


def parse_annotation(annotation: Any) -> Node | None:
    """``annotation`` (an object or its text) as a node tree; None when it says nothing."""
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = text.strip().strip("'\"")
    if not text:
        return None
    try:
        parser = _Parser(text)
        node = parser.union()
    except IndexError:  # unbalanced text: say nothing rather than guess
        return None
    return node if parser.peek() is None else None


def _base(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def fits(value: Any, node: Node) -> bool | None:
    """True/False when ``node`` says whether a YAML ``value`` fits; None when it cannot tell."""
    name, args = node
    if name == "|":
        answers = [fits(value, arm) for arm in args]
        if any(a is True for a in answers):
            return True
        return None if any(a is None for a in answers) else False
    base = _base(name)
    if base == "Optional":
        return True if value is None else fits(value, args[0]) if args else None
    if base == "Union":
        return fits(value, ("|", args)) if args else None
    if base in ("None", "NoneType"):
        return value is None
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base in ("float", "complex"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base in _PATHS:
        return isinstance(value, str)
    if base == "Callable":
        return False  # YAML gives no callables (an object spec is a mapping, not judged here)
    if base in _SEQUENCES or base in _SEQUENCE_ABCS:
        return _fits_sequence(value, base, args)
    if base in _MAPPINGS:
        return isinstance(value, dict)
    if base in _ARRAYS and isinstance(value, str):
        return False  # a tensor's place: numbers and lists may be converted, text never
    return None  # a class we do not know (Tensor, Distance, ...), Any, Literal...


def _fits_sequence(value: Any, base: str, args: list[Node] | None) -> bool | None:
    if not isinstance(value, (list, tuple)):
        if base in _SEQUENCE_ABCS and isinstance(value, str):
            return None  # a string is a Sequence to Python
        return False
    if not args:
        return True
    if base in ("tuple", "Tuple") and not (len(args) == 2 and args[1] == ("...", None)):
        if len(args) == 1 and args[0] == ("[]", []):  # tuple[()]
            return len(value) == 0
        if len(value) != len(args):
            return False
        answers = [fits(v, a) for v, a in zip(value, args)]
    else:
        answers = [fits(v, args[0]) for v in value]
    answers = [a for v, a in zip(value, answers) if not isinstance(v, dict)]
    if any(a is False for a in answers):
        return False
    return True


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    else:
        text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}" if value is not None else text


def argument_problem(param: inspect.Parameter, value: Any) -> str | None:
    """What is wrong with ``value`` for ``param`` (``expected ..., got ...``), or None."""
    if isinstance(value, dict) or not isinstance(value, (type(None), bool, int, float, str, list)):
        return None  # an object spec, or an object built from one: not a YAML scalar or list
    default = param.default
    if value is None and default in (None, inspect.Parameter.empty):
        return None  # a default of None (or an injected keyword's placeholder) takes null
    node = parse_annotation(param.annotation)
    if node is not None:
        answer = fits(value, node)
        if answer is False:
            text = param.annotation if isinstance(param.annotation, str) else None
            text = (text or inspect.formatannotation(param.annotation)).strip("'\"")
            hint = ""
            if isinstance(value, bool):
                hint = f" (YAML true/false is a boolean, which Python would read as {int(value)})"
            return f"expected {text}, got {_shown(value)}{hint}"
        return None
    if isinstance(default, bool):
        if not isinstance(value, (bool, int, type(None))):
            return f"expected true or false (the default is {str(default).lower()}), got {_shown(value)}"
    elif isinstance(default, (int, float)):
        if not isinstance(value, (int, float, type(None))):
            return f"expected a number (the default is {default!r}), got {_shown(value)}"
    return None


def check_argument_types(
    params: Iterable[inspect.Parameter],
    kwargs: dict,
    where: str,
    error: Callable[[str], Exception] = TypeError,
) -> None:
    """Raise ``error("WHERE.KEY: expected ..., got ...")`` for the first value of ``kwargs``
    that its parameter's annotation (or numeric/boolean default) rules out.

    Args:
        params: the callable's keyword parameters (a class's, followed up its ``**kwargs``).
        kwargs: the config's keywords (YAML values, or built objects, which are not judged).
        where: the config key of the object, e.g. ``mining_funcs.tuple_miner.TripletMarginMiner``.
        error: the exception class to raise.
    """
    by_name = {p.name: p for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    for key, value in kwargs.items():
        param = by_name.get(key)
        if param is None:
            continue
        problem = argument_problem(param, value)
        if problem is not None:
            loc = f"{where}.{key}" if where else str(key)
            raise error(f"{loc}: {problem}")
