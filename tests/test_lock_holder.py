"""tests/lock_holder.py: a process holding the package's real run-folder lock (the busy-folder
tests' other live run) without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pml_rank_plugins.running import run_folder
from tests.lock_holder import REPO, hold_lock


def test_lock_holder_is_a_live_run_to_the_package_and_imports_no_torch(tmp_path):
    run_dir = tmp_path / "A" / "seed0"
    holder = hold_lock(run_dir)
    try:
        assert holder.poll() is None
        with pytest.raises(run_folder.RunFolderBusy, match="in use by another run"):
            with run_folder.lock(run_dir):
                pass
        assert (run_dir / "config.yaml").read_text() == "live: 1\n"
    finally:
        holder.kill()
        holder.wait()
    with run_folder.lock(run_dir):  # released with its process
        pass
    code = (
        "import sys, tests.lock_holder as h; h.import_run_folder(); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"
