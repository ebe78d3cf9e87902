"""Locates ../shared (beside the repository) for tests that read the project's real data."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """$PML_RANK_SHARED, else <repo>/../shared, else /work/shared; fails loudly if none exists."""
    candidates = [os.environ.get("PML_RANK_SHARED"), REPO.parent / "shared", "/work/shared"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "data").is_dir():
            return Path(candidate)
    raise FileNotFoundError(f"shared data not found; tried {candidates} (set PML_RANK_SHARED)")
