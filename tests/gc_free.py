"""Explicit ``gc.collect()`` calls made a no-op, for tests whose cost they dominate.

``statsmodels.stats.multitest.multipletests(method="holm")`` calls ``gc.collect()`` on every
call. ``summarize`` (``reporting.statistics.holm``) calls it once per family and metric (six
times for a three-metric table), and each full collection of a test process that holds torch,
PML, matplotlib and the session's objects takes 0.15-0.7 s of CPU: most of the time of the
table tests and about a second per in-process ``compare``. Python's automatic collector still runs;
what the tests compute and check is unchanged (a collection frees memory, nothing else).

Use ``pytestmark = pytest.mark.usefixtures("no_gc_collect")`` after importing the fixture, and
:func:`gc_collect_skipped` around the work of a module-scoped fixture.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import pytest


@contextlib.contextmanager
def gc_collect_skipped() -> Iterator[None]:
    """``gc.collect`` returns 0 without collecting inside the block."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gc, "collect", lambda generation=2: 0)
        yield


@pytest.fixture
def no_gc_collect() -> Iterator[None]:
    """:func:`gc_collect_skipped` for the test."""
    with gc_collect_skipped():
        yield
