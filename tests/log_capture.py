"""The root logger's lines in the CLI's format (``LEVEL name: message``), captured into a string."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Iterator


@contextlib.contextmanager
def root_log_lines() -> Iterator[io.StringIO]:
    """Inside the block the root logger (level INFO) also writes its records, formatted as the
    CLI prints them, into the yielded stream; the handler and the level are restored after."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
