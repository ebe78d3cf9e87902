"""The MLRC protocol's configuration: class-disjoint cross-validation folds and a test half.

**MLRC** (Musgrave, Belongie, Lim, "A Metric Learning Reality Check", ECCV 2020). Selected by the
split function ``mlrc_protocol``::

    dataset: {CUB200: {root: CUB_200_2011, split: all}}
    split: {mlrc_protocol: {num_folds: 4}}      # first half of the classes -> 4 class-disjoint
                                                # folds; second half -> test
    eval: {validation: [val], test: [test]}

or, where a reader publishes the two halves itself (SOP's ``Ebay_train``/``Ebay_test``)::

    datasets: {trainval: {...split: train}, test: {...split: test}}
    split: {mlrc_protocol: {num_folds: 4}}      # folds over datasets.trainval

``pml-rank train`` then trains one model per fold into ``RUN_DIR/fold<k>/`` (an ordinary run:
``split.fold = k``, train on the other folds' classes, validate on fold k's, test on the test
half) and writes ``RUN_DIR/metrics.json`` whose ``test`` holds

* ``concatenated``: the metrics of the k models' embeddings concatenated (k x dim; each model's
  embeddings L2-normalized first when the tester normalizes, as PML's does by default);
* ``separated``: each model's own test metrics, averaged over the folds (``folds`` lists them).

``--set split.fold=K`` trains fold K alone as an ordinary run.

This module holds the protocol's configuration (which config is MLRC, fold configs, the split
contract); the fold datasets are built by :func:`.datasets.mlrc_fold_splits` and the run by
:mod:`pml_rank_plugins.running.mlrc`.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from . import registry
from .schema import SPLIT_KEYS, ConfigError, spec_name_and_kwargs
from .spec import Protocol


def _split_function(config: dict):
    split = {k: v for k, v in (config.get("split") or {}).items() if k not in SPLIT_KEYS}
    if not split:
        return None, None, {}
    name, kwargs = spec_name_and_kwargs(split, "split")
    return name, registry.resolve(name, "split"), kwargs


def is_mlrc(config: dict) -> bool:
    """True when ``split:`` names the ``mlrc_protocol`` function (a parsed spec holds it:
    ``spec.protocol.is_mlrc``)."""
    return Protocol.parse(config).is_mlrc


def mlrc_fold(config: dict) -> int | None:
    fold = (config.get("split") or {}).get("fold")
    return None if fold is None else int(fold)


def mlrc_num_folds(config: dict) -> int:
    _, _, kwargs = _split_function(config)
    return int(kwargs.get("num_folds", 4))


def mlrc_fold_config(config: dict, fold: int) -> dict:
    """The ordinary single-run config of fold ``fold``."""
    cfg = copy.deepcopy(config)
    cfg["split"]["fold"] = int(fold)
    return cfg


def check_split_parts(fn_name: str, parts: Any, names: list) -> None:
    """A split function must return one index array per name; explain what went wrong."""
    if not isinstance(parts, (list, tuple)) or any(
        not (isinstance(p, np.ndarray) and p.ndim == 1 and np.issubdtype(p.dtype, np.integer))
        for p in parts
    ):
        raise ConfigError(
            f"split: {fn_name} must return one 1-D index array per name in split.names "
            f"({names}); it returned {type(parts).__name__} of "
            f"{[type(p).__name__ for p in parts] if isinstance(parts, (list, tuple)) else '?'}. "
            "For cross-validation folds use the MLRC protocol: split: {mlrc_protocol: "
            "{num_folds: 4}} (one model per fold, see pml_rank_plugins.experiment.mlrc)."
        )
    if len(parts) != len(names):
        raise ConfigError(
            f"split: {fn_name} returned {len(parts)} parts for names {names}; "
            f"set split.names to {len(parts)} names"
        )
