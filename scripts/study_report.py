"""The Omniglot study's reports (scripts/run_study.sh publish), a thin wrapper of the package.

    python scripts/study_report.py runs/study docs/study                  # the phases' tables
    python scripts/study_report.py splits docs/study docs/results.md      # across the splits

The code lives in the package (shipped in the wheel, tested in tests/reporting/):
``pml_rank_plugins.reporting.study_tables.write_study_tables`` (tuning progress, the
convergence probe and checks, tuning gain, vs_best, claims, wall time: the module docstrings say
what each table holds), ``pml_rank_plugins.reporting.results_page.splits_main`` (the generated
regions of docs/results.md) and ``pml_rank_plugins.reporting.across_splits`` (the pooled verdicts
and ``level_simulation``). For any config, ``pml-rank study CONFIG --splits K`` runs and reports a
whole study in one command.
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")  # noqa: E402 -- before the package draws: no display needed

# docs/results.md's generated text names level_simulation "in scripts/study_report.py"
from pml_rank_plugins.reporting.across_splits import level_simulation  # noqa: E402,F401
from pml_rank_plugins.reporting.results_page import splits_main  # noqa: E402
from pml_rank_plugins.reporting.study_tables import write_study_tables  # noqa: E402

if __name__ == "__main__":
    if sys.argv[1:2] == ["splits"]:  # study_report.py splits DOCS PAGE
        sys.exit(splits_main(*sys.argv[2:4]))
    sys.exit(write_study_tables(*sys.argv[1:3]))
