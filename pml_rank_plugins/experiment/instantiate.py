"""Turning ``{Name: kwargs}`` specs into objects, with errors that name the config key.

Every class or function a config names is resolved by :mod:`.registry`; :func:`build_object`
checks the keywords against the signature, injects the keywords the runner supplies (a dataset's
``transform``, a sampler's ``labels``) when the signature takes them and the config does not set
them, and :func:`call_named` prefixes any constructor error with ``where: Name:``.
"""

from __future__ import annotations

from typing import Any

from . import registry
from .schema import ConfigError, is_object_spec, spec_name_and_kwargs


def instantiate(value: Any, where: str = "config", **injected) -> Any:
    """Recursively turn object specs inside ``value`` into objects.

    ``injected`` keywords are added to the outermost call when its signature accepts them and
    the config does not already set them.
    """
    if is_object_spec(value):
        return build_object(value, where, **injected)
    if isinstance(value, dict):
        return {k: instantiate(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [instantiate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def build_object(spec: Any, where: str, **injected) -> Any:
    """Instantiate one ``{Name: kwargs}`` spec (a bare ``"Name"`` means no kwargs)."""
    name, kwargs = spec_name_and_kwargs(spec, where)
    obj = registry.resolve(name, where)
    kwargs = {k: instantiate(v, f"{where}.{name}.{k}") for k, v in kwargs.items()}
    registry.check_keywords(obj, kwargs, where, name)
    accepted = registry.accepted_keywords(obj)
    for k, v in injected.items():
        if k not in kwargs and (accepted is None or k in accepted):
            if accepted is None and k not in _named_params(obj):
                continue
            kwargs[k] = v
    return call_named(where, name, obj, **kwargs)


def call_named(where: str, name: str, fn, /, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``; an exception is re-raised with ``where: name:`` in front, so every
    error while building an object names its config key (``optimizers.trunk_optimizer: Adam:
    ...``). The type is kept where it takes a message (so callers can still catch it), else
    :class:`ConfigError`; a ``TypeError`` also shows the signature."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        prefix = f"{where}: {name}: "
        if str(e).startswith(prefix):
            raise
        if isinstance(e, TypeError):
            msg = f"{prefix}{e}; signature: {registry.signature_text(fn)}"
            raise TypeError(msg) from e
        raise _renamed(e, prefix) from e


def _renamed(e: Exception, prefix: str) -> Exception:
    # errors a constructor raises on a bad value without saying so: a config mistake (exit 2)
    if type(e) in (
        Exception,
        RuntimeError,
        KeyError,
        AssertionError,
        IndexError,
        AttributeError,
        OverflowError,
        ZeroDivisionError,
    ):
        return ConfigError(f"{prefix}{type(e).__name__}: {e}")
    try:
        return type(e)(f"{prefix}{e}")
    except Exception:  # an exception class whose constructor wants more than a message
        return ConfigError(f"{prefix}{type(e).__name__}: {e}")


def _named_params(obj) -> set[str]:
    try:
        return {p.name for p in registry._init_params(obj)}
    except (TypeError, ValueError):
        return set()
