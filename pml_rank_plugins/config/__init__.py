"""Configs, registry, runner and comparison (powerful-benchmarker-shaped YAML for PML 2.9).

``registry`` resolves class names (rule in its docstring), ``schema`` loads/merges/validates
configs, ``builder`` makes PML objects, ``evaluation`` adds Recall@K to PML's
``AccuracyCalculator``, ``runner`` trains/resumes/evaluates, ``compare`` writes tables and plots.
"""

from .evaluation import RecallAtKAccuracyCalculator, make_accuracy_calculator
from .registry import register, resolve
from .schema import ConfigError, load_config

__all__ = [
    "ConfigError",
    "RecallAtKAccuracyCalculator",
    "load_config",
    "make_accuracy_calculator",
    "register",
    "resolve",
]
