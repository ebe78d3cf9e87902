"""The tests that ``tests/conftest.py`` marks slow by name (``SLOW_ELSEWHERE``) still exist, so
a rename cannot silently put a long test back into ``make test-fast``."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOW_ELSEWHERE

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_marked_slow_by_name_exists():
    assert SLOW_ELSEWHERE
    for node in sorted(SLOW_ELSEWHERE):
        path, name = node.split("::")
        assert f"\ndef {name}(" in (ROOT / path).read_text(), f"{node}: no such test"
