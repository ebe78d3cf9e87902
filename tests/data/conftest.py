"""Fixtures for the data tests: where the shared data lives, and a cached full-size GlyphDataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """``$PML_RANK_SHARED`` if set, else ``<repo>/../shared`` if it exists, else ``/work/shared``."""
    env = os.environ.get("PML_RANK_SHARED")
    if env:
        return Path(env)
    beside = REPO_ROOT / ".." / "shared"
    return beside if beside.is_dir() else Path("/work/shared")


@pytest.fixture(scope="session")
def full_glyphs(tmp_path_factory):
    """The default GlyphDataset, built once per test session into a temporary cache."""
    from pml_rank_plugins.data import GlyphDataset

    return GlyphDataset(root=tmp_path_factory.mktemp("glyph_cache"))
