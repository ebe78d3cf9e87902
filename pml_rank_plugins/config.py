"""Deprecated: the old ``pml_rank_plugins.config`` package, kept for this release only.

It was split by job into :mod:`pml_rank_plugins.experiment` (configs, registry, builder),
:mod:`pml_rank_plugins.running` (train, evaluate, checkpoints, run folders) and
:mod:`pml_rank_plugins.reporting` (comparison, statistics, tables, plots, sweep); the Revisited
Oxford/Paris metric moved to :mod:`pml_rank_plugins.functional.revisited`. Every old import
path still resolves to the new module (``pml_rank_plugins.config.registry`` *is*
:mod:`pml_rank_plugins.experiment.registry`), with a :class:`DeprecationWarning`. CHANGELOG.md
lists each move. This module is removed in the next release.
"""

from __future__ import annotations

import sys
import warnings

from .data import splits as _data_splits
from .experiment import accuracy as _accuracy
from .experiment import builder as _builder
from .experiment import check as _check
from .experiment import data_root as _data_root
from .experiment import mlrc as _mlrc
from .experiment import registry as _registry
from .experiment import schema as _schema
from .experiment import shipped as _shipped
from .experiment import transforms as _transforms
from .experiment.accuracy import RecallAtKAccuracyCalculator, make_accuracy_calculator
from .experiment.registry import register, resolve
from .experiment.schema import ConfigError, load_config
from .functional import revisited as _revisited
from .functional.revisited import revisited_evaluate
from .reporting import compare as _compare
from .reporting import retrieval as _retrieval
from .reporting import statistics as _statistics
from .reporting import sweep as _sweep
from .running import distributed as _distributed
from .running import nonfinite as _nonfinite
from .running import run_folder as _run_folder
from .running import runner as _runner

# old submodule name -> the module that holds its content now
MOVED = {
    "builder": _builder,
    "check": _check,
    "compare": _compare,
    "data_root": _data_root,
    "distributed": _distributed,
    "evaluation": _accuracy,
    "faults": _nonfinite,
    "protocols": _mlrc,
    "registry": _registry,
    "retrieval": _retrieval,
    "revisited": _revisited,
    "run_folder": _run_folder,
    "runner": _runner,
    "schema": _schema,
    "shipped": _shipped,
    "splits": _data_splits,
    "statistics": _statistics,
    "sweep": _sweep,
    "transforms": _transforms,
}
for _name, _module in MOVED.items():
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module

warnings.warn(
    "pml_rank_plugins.config is deprecated: import from pml_rank_plugins.experiment, "
    ".running, .reporting or .functional (see CHANGELOG.md)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ConfigError",
    "RecallAtKAccuracyCalculator",
    "load_config",
    "make_accuracy_calculator",
    "register",
    "resolve",
    "revisited_evaluate",
]
