"""The resume policy: what may change when a run is continued, and when a run has plateaued.

``--resume`` continues a run from its ``latest.pt``. Only the budget (:data:`BUDGET_KEYS`) and
where the data lives (``data_root``: the data moved, or ``--data-root``/``$PML_RANK_DATA`` is set
now and was not then) may differ from the saved ``config.yaml``, so a finished run can be extended
with more epochs or a longer patience; any other change is refused with the list of changed keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..experiment.schema import MISSING, ConfigError, config_diff

# Config keys that may change when resuming: they extend or shorten the budget, nothing else.
BUDGET_KEYS = ("trainer.*.num_epochs", "eval.patience", "eval.test_interval")
# Where the files are, not what is trained: may change too (as `eval --data-root` may).
# where the data is, and how the tables test (not what is trained)
LOCATION_KEYS = ("data_root", "compare.equivalence_margin")
# How the same computation is executed (torch.compile equals eager within float tolerance).
EXECUTION_KEYS = ("trainer.*.compile",)


def check_resume_config(saved: dict, config: dict, saved_path: Path) -> None:
    """Raise ``ConfigError`` listing every changed key except :data:`BUDGET_KEYS`,
    :data:`LOCATION_KEYS` and :data:`EXECUTION_KEYS`."""
    changed = [d for d in config_diff(saved, config) if not _is_budget_key(d[0])]
    if changed:
        shown = "; ".join(f"{path}: {_show(old)} -> {_show(new)}" for path, old, new in changed)
        raise ConfigError(
            f"--resume: config differs from {saved_path} in {shown}. Only the budget "
            f"({', '.join(BUDGET_KEYS)}), data_root, compare.equivalence_margin and "
            "trainer.compile may change on resume; train the changed config into "
            "another --out (or pass --overwrite without --resume to start again)"
        )


def _is_budget_key(path: str) -> bool:
    parts = path.split(".")

    def matches(pat: str, prefix: bool) -> bool:
        pats = pat.split(".")
        length_ok = len(parts) >= len(pats) if prefix else len(parts) == len(pats)
        return length_ok and all(p == q or q == "*" for p, q in zip(parts, pats))

    # an execution key's sub-keys too (trainer.X.compile.backend)
    return any(matches(pat, False) for pat in BUDGET_KEYS + LOCATION_KEYS) or any(
        matches(pat, True) for pat in EXECUTION_KEYS
    )


def _show(value: Any) -> str:
    return "<absent>" if value is MISSING else repr(value)


def plateaued(patience: int | None, best: dict, epoch: int) -> bool:
    """True when ``patience`` is set and the best epoch lies more than ``patience`` epochs back."""
    return patience is not None and best["epoch"] is not None and epoch - best["epoch"] > patience
