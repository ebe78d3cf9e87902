"""Defining an experiment: configs, names, objects and data (no training happens here).

``registry`` resolves the class names a config uses, ``schema`` loads, merges and validates
configs, ``spec`` parses a validated config once into a :class:`RunSpec` (what the runner reads), ``instantiate``/``builder`` make the PML objects, ``datasets``/``transforms``/
``data_root``/``mlrc``/``revisited`` build the data splits, ``accuracy`` adds Recall@K to PML's
``AccuracyCalculator``, ``methods`` collects the methods of a comparison and ``check`` builds
every object of a config without training (``pml-rank check``). The shipped YAML configs live in
``experiment/configs``.

Import direction: :mod:`pml_rank_plugins.running` imports this package,
:mod:`pml_rank_plugins.reporting` imports both; this package imports neither.
"""

from .accuracy import RecallAtKAccuracyCalculator, TorchKNN, make_accuracy_calculator
from .builder import Experiment, build_experiment, build_tester, eval_settings, make_trainer
from .check import check_configs, check_method
from .data_root import ENV_VAR, resolve_data_root
from .datasets import build_splits
from .instantiate import build_object, instantiate
from .methods import check_methods, collect_methods, slug
from .registry import (
    UnknownNameError,
    allow_modules,
    allowed_modules,
    listing,
    register,
    resolve,
    unregister,
)
from .schema import ConfigError, dump_yaml, load_config, load_yaml, validate
from .search_space import Param, check_tune_config, method_space
from .shipped import resolve_config, shipped_configs
from .spec import EvalSettings, PictureSettings, Protocol, RunSpec, TrainerSpec

__all__ = [
    "ENV_VAR",
    "ConfigError",
    "EvalSettings",
    "PictureSettings",
    "Experiment",
    "Param",
    "Protocol",
    "RecallAtKAccuracyCalculator",
    "RunSpec",
    "TorchKNN",
    "TrainerSpec",
    "UnknownNameError",
    "allow_modules",
    "allowed_modules",
    "build_experiment",
    "build_object",
    "build_splits",
    "build_tester",
    "check_configs",
    "check_method",
    "check_methods",
    "check_tune_config",
    "collect_methods",
    "dump_yaml",
    "eval_settings",
    "instantiate",
    "listing",
    "load_config",
    "load_yaml",
    "make_accuracy_calculator",
    "make_trainer",
    "method_space",
    "register",
    "resolve",
    "resolve_config",
    "resolve_data_root",
    "shipped_configs",
    "slug",
    "unregister",
    "validate",
]
