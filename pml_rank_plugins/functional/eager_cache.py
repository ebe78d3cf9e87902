"""A ``functools.lru_cache`` for eager calls only, for the kernels' constant tables.

Under ``torch.compile`` Dynamo traces a cached function's body anyway (it cannot look a traced
call up in the cache) and warns that it ignores the ``lru_cache`` ("potential silent
incorrectness"); called uncached while compiling, the builder's operations are part of the graph
and nothing is cached from inside a trace. Eager calls keep the cache (one build per argument
tuple, then a dictionary look-up).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

Result = TypeVar("Result")


def eager_lru_cache(maxsize: int) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Decorator: ``fn`` through ``functools.lru_cache(maxsize)`` in eager mode, ``fn`` itself
    while ``torch.compile`` traces (``torch.compiler.is_compiling()``). ``fn``'s arguments must
    be hashable; the wrapper exposes ``cache_info`` / ``cache_clear`` of the eager cache."""

    def wrap(fn: Callable[..., Result]) -> Callable[..., Result]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args):
            if torch.compiler.is_compiling():
                return fn(*args)
            return cached(*args)

        call.cache_info, call.cache_clear = cached.cache_info, cached.cache_clear
        return call

    return wrap
