"""Another live run for the busy-folder tests: ``python -m tests.lock_holder RUN_DIR`` holds
``RUN_DIR``'s lock (the package's own :func:`pml_rank_plugins.running.run_folder.lock`), writes a
``config.yaml`` of its own there, prints ``locked`` and sleeps until killed.

The lock code is the real one, but the process imports only ``run_folder`` and
``experiment.errors``: the ``running`` and ``experiment`` packages' ``__init__`` (which import
torch, 3-5 s of CPU per process) are replaced by empty namespace modules over the same folders.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def import_run_folder() -> types.ModuleType:
    """``pml_rank_plugins.running.run_folder`` without importing torch (see the module docstring)."""
    import pml_rank_plugins  # its __init__ imports nothing heavy (tests/test_cli_consistency.py)

    root = Path(pml_rank_plugins.__file__).parent
    for name in ("experiment", "running"):
        package = types.ModuleType(f"pml_rank_plugins.{name}")
        package.__path__ = [str(root / name)]
        sys.modules[package.__name__] = package
    from pml_rank_plugins.running import run_folder

    assert "torch" not in sys.modules, "the lock holder imported torch after all"
    return run_folder


def hold_lock(run_dir: Path) -> subprocess.Popen:
    """Start a holder of ``run_dir``'s lock; return once it holds it (kill it to release)."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.lock_holder", str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


if __name__ == "__main__":
    with import_run_folder().lock(sys.argv[1]) as held:
        (held / "config.yaml").write_text("live: 1\n")
        print("locked", flush=True)
        time.sleep(120)
