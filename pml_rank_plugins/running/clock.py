"""Where a run's wall time goes: seconds per phase, recorded in ``metrics.json``.

A study's cost is judged by its phases (issue 27: evaluation, checkpoints, pictures, start-up and
bookkeeping should be at most 10% of the wall time); :class:`PhaseClock` adds the seconds spent
inside each ``with clock.phase(name):`` block. Phases of a run: ``setup`` (building data, models,
tester and trainer), ``train`` (the trainer's epochs), ``validation``, ``checkpoints`` (writing
``best.pt``/``latest.pt``), ``test`` (the final evaluation). O(1) per block.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator


class PhaseClock:
    """Seconds per named phase, summed over the blocks that ran (``seconds``: name -> s)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def as_dict(self) -> dict[str, float]:
        """The phases rounded to milliseconds (for JSON)."""
        return {k: round(v, 3) for k, v in self.seconds.items()}
