"""The parts of ``scripts/gpu_check.py`` in one process, for ``gpu_check.py --tiny``.

``python scripts/gpu_check_group.py OUT PART=BUDGET [PART=BUDGET ...] --device cuda|cpu [--tiny]``
runs each ``PART`` as its script (``gpu_check_parts.py``, ``gpu_check_dist.py`` or
``gpu_check_knn.py``: :data:`PARTS`) run as ``SCRIPT PART --device ... --out OUT/parts/PART
--budget BUDGET`` would (:func:`gpu_check_parts.part_main`: its ``result.json``, a failure with
the traceback when the part raises), one after another in this process, and adds the part's
``seconds`` to its ``result.json``. A ``--tiny`` run (CI on the CPU, ``tests/test_gpu_check.py``)
thus imports torch, PML and the package once for all parts instead of once per part (2-3 s of
CPU each); the processes a part starts itself (``torchrun`` and its ranks) are still started. A
full run keeps one process per part (``gpu_check.run_part``). The parts' time limits are added up
into the limit of this process (``gpu_check.run_group``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gpu_check_dist
import gpu_check_knn
import gpu_check_parts

# every part's function, by the part's name, as its script's part_main gets it
PARTS = {
    **gpu_check_parts.PARTS,
    "distributed": gpu_check_dist.part_distributed,
    "knn": gpu_check_knn.part_knn,
}
SCRIPTS = {
    **{part: gpu_check_parts.__file__ for part in gpu_check_parts.PARTS},
    "distributed": gpu_check_dist.__file__,
    "knn": gpu_check_knn.__file__,
}


def part_budget(text: str) -> tuple[str, str]:
    """``"tests=80"`` -> ``("tests", "80")``; an unknown part or a budget that is not a number is
    refused, naming it."""
    part, _, budget = text.partition("=")
    if part not in PARTS:
        raise argparse.ArgumentTypeError(
            f"unknown part {part!r} in {text!r}; choose from {', '.join(PARTS)}"
        )
    try:
        float(budget)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget is not a number") from None
    return part, budget


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the report folder (parts in OUT/parts/PART)")
    parser.add_argument(
        "parts", nargs="+", type=part_budget, help="PART=BUDGET: the part and its --budget"
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    saved_argv = sys.argv
    for part, budget in args.parts:
        folder = args.out / "parts" / part
        sys.argv = [SCRIPTS[part], part, "--device", args.device, "--out", str(folder)]
        sys.argv += ["--budget", budget] + (["--tiny"] if args.tiny else [])
        start = time.monotonic()
        try:
            gpu_check_parts.part_main({part: PARTS[part]})
        finally:
            sys.argv = saved_argv
        result_file = folder / "result.json"
        result = json.loads(result_file.read_text())
        result["seconds"] = round(time.monotonic() - start, 1)
        result_file.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"gpu_check_group: {part}: {result['status']}", flush=True)


if __name__ == "__main__":
    main()
