"""The deprecated ``pml_rank_plugins.config`` alias module (kept for this release, see CHANGELOG).

Old import paths must give the very objects of their new homes, and warn once that they moved.
Run in a subprocess so the warning is seen on a fresh import.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pml_rank_plugins.experiment.registry as registry
from pml_rank_plugins.data.splits import query_gallery_split
from pml_rank_plugins.experiment.schema import ConfigError
from pml_rank_plugins.functional.revisited import revisited_evaluate
from pml_rank_plugins.reporting import compare, statistics
from pml_rank_plugins.running import runner


def test_old_import_paths_give_the_moved_objects():
    import pml_rank_plugins.config as old
    from pml_rank_plugins.config import ConfigError as OldConfigError
    from pml_rank_plugins.config import register
    from pml_rank_plugins.config import revisited_evaluate as old_evaluate
    from pml_rank_plugins.config.compare import run_comparison
    from pml_rank_plugins.config.registry import resolve
    from pml_rank_plugins.config.revisited import revisited_map
    from pml_rank_plugins.config.runner import train
    from pml_rank_plugins.config.statistics import t_interval

    assert register is registry.register and resolve is registry.resolve
    assert old_evaluate is revisited_evaluate and OldConfigError is ConfigError
    assert run_comparison is compare.run_comparison and train is runner.train
    assert t_interval is statistics.t_interval
    assert revisited_map.__module__ == "pml_rank_plugins.functional.revisited"
    assert old.splits.query_gallery_split is query_gallery_split
    # a config that names the old dotted path still resolves
    assert registry.resolve("pml_rank_plugins.config.splits.query_gallery_split") is (
        query_gallery_split
    )


def test_importing_the_old_package_warns_that_it_moved():
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from pml_rank_plugins.config import register
        print([str(w.message) for w in caught if w.category is DeprecationWarning])
        """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pml_rank_plugins.config is deprecated" in out
    assert "pml_rank_plugins.experiment" in out
