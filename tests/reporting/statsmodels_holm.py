"""statsmodels' Holm adjustment, the reference the Holm tests compare with, without its cost here.

``multipletests`` runs a full ``gc.collect()`` on every call: 0.2-0.4 s in a test process that
holds the objects of every test before it (4 of the 6 CPU s that ``gc.collect`` took in one
profiled ``make test-fast``). The objects alive before the call are frozen (``gc.freeze``), so
the collection walks only the call's own; the values are statsmodels' as they are.
"""

from __future__ import annotations

import gc
from typing import Sequence

from statsmodels.stats.multitest import multipletests


def holm_by_statsmodels(pvalues: Sequence[float]) -> list[float]:
    """``multipletests(pvalues, method="holm")``'s adjusted p-values."""
    gc.freeze()
    try:
        return [float(p) for p in multipletests(list(pvalues), alpha=0.05, method="holm")[1]]
    finally:
        gc.unfreeze()
