"""Helpers that write tiny dataset trees in the published formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, value: int, size: tuple[int, int] = (6, 4)) -> None:
    """A small RGB PNG (whatever the suffix says, PIL opens by content) filled with ``value``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(path, format="PNG")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def pixel_value(image) -> int:
    return round(image[0, 0, 0].item() * 255)


def write_jpeg(path: Path, pixels: np.ndarray) -> None:
    """A real JPEG (quality 95) of the uint8 ``(H, W, 3)`` array ``pixels``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path, format="JPEG", quality=95)
