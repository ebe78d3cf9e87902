"""Are two comparisons' runs bit-identical? (issue 30: behaviour unchanged by a refactor)

``python scripts/same_metrics.py BEFORE_OUT AFTER_OUT`` compares, for every ``<method>/seed<S>/
metrics.json`` under ``BEFORE_OUT``, the test metrics, the validation history, the per-epoch
training loss and the best epoch/value with the run of the same path under ``AFTER_OUT``, exactly
(``==`` on the floats JSON holds). Prints one line per run and exits 1 on any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COMPARED = ("seed", "status", "epochs_run", "stopped_early", "best", "test")


def numbers(metrics: dict) -> dict:
    """What a run computed (not how long it took): the keys of :data:`COMPARED` and, per epoch,
    the training loss and the validation metrics."""
    out = {key: metrics.get(key) for key in COMPARED}
    out["history"] = [
        {k: row.get(k) for k in ("epoch", "train_loss", "validation")}
        for row in metrics.get("history", [])
    ]
    return out


def main(before: Path, after: Path) -> int:
    runs = sorted(before.glob("*/seed*/metrics.json"))
    if not runs:
        print(f"{before}: no <method>/seed<S>/metrics.json", file=sys.stderr)
        return 1
    bad = 0
    for path in runs:
        rel = path.relative_to(before)
        other = after / rel
        if not other.is_file():
            print(f"MISSING {rel}")
            bad += 1
            continue
        a, b = numbers(json.loads(path.read_text())), numbers(json.loads(other.read_text()))
        same = a == b
        bad += not same
        test = a["test"].get("test", a["test"])
        shown = {k: test[k] for k in sorted(test) if "average_precision" in k or "at_1" in k}
        print(f"{'SAME' if same else 'DIFFERENT'} {rel} {json.dumps(shown)}")
        if not same:
            for key in a:
                if a[key] != b[key]:
                    print(f"  {key}: {a[key]!r} != {b[key]!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
