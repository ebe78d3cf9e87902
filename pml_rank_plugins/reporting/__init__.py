"""Reporting on runs: comparisons, sweeps, statistics, tables, plots and retrieval pictures.

``compare`` trains every method x seed (through :mod:`pml_rank_plugins.running`) and writes the
outputs, ``sweep`` does the same over a grid of overrides, ``summary`` turns run results into
rows with 95% CIs and paired tests (``statistics``), ``tables`` and ``plots`` write them, and
``retrieval`` draws the retrieval pictures, ``tune_report`` runs ``pml-rank tune`` and
writes its outputs, and ``study`` runs ``pml-rank study`` (tune, the tuned settings on several
class splits, the pooled verdict of ``across_splits``; ``study_page`` writes its report).
``study_tables``, ``convergence`` and ``results_page`` write the Omniglot study's published
tables (``docs/results.md``, ``docs/study``).

Import direction: imports :mod:`pml_rank_plugins.running` and
:mod:`pml_rank_plugins.experiment`; nothing in the package imports it except the CLI.
"""

from .compare import run_comparison, write_pictures
from .plots import write_plots
from .retrieval import compute_retrieval, write_retrieval_pictures
from .statistics import describe_runs, paired_difference, t_interval
from .study import run_study
from .summary import load_run_dirs, primary_metric, summarize, summarize_dir, write_outputs
from .sweep import parse_grid, prepare_sweep, run_sweep
from .tables import markdown_table, metric_label, write_csv
from .tune_report import run_tune

__all__ = [
    "compute_retrieval",
    "describe_runs",
    "load_run_dirs",
    "markdown_table",
    "metric_label",
    "paired_difference",
    "parse_grid",
    "prepare_sweep",
    "primary_metric",
    "run_comparison",
    "run_study",
    "run_sweep",
    "run_tune",
    "summarize",
    "summarize_dir",
    "t_interval",
    "write_csv",
    "write_outputs",
    "write_pictures",
    "write_plots",
    "write_retrieval_pictures",
]
