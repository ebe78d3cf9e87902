"""pml_rank_plugins: metric learning to rank (FastAP, mAP_Q/mAP_T, Ranked List Loss) for PML.

Subpackages, in import order (each imports only the ones above it):
    functional -- pure tensor functions (no PML dependency): histograms, AP, RLL terms,
        the Revisited Oxford/Paris metric.
    utils -- helpers shared by losses and miners.
    losses, miners, samplers, trainers -- thin PML classes over ``functional``.
    data -- datasets with two-level labels (see ``pml_rank_plugins.data.labels``) and splits.
    models -- embedding networks.
    experiment -- defining an experiment: configs, registry, builder, datasets, ``check``.
    running -- running it: train, evaluate, checkpoints, run folders, MLRC, worker pool.
    reporting -- reporting on it: comparison, statistics, tables, plots, sweep, pictures.
    cli, cli_args, commands -- ``pml-rank`` (one class per command in ``commands/``), on top.

``pml_rank_plugins.load_run``, ``embed`` and ``LoadedRun`` are
:mod:`pml_rank_plugins.running`'s (using a trained run).
"""

import importlib

from ._version import __version__

# Re-exported lazily (PEP 562): `import pml_rank_plugins` -- and so `pml-rank --help`, which
# imports pml_rank_plugins.cli -- must not import torch (tests/test_cli_consistency.py).
_FROM_RUNNING = ("LoadedRun", "embed", "load_run")

__all__ = ["__version__", *_FROM_RUNNING]


def __getattr__(name: str):
    if name in _FROM_RUNNING:
        return getattr(importlib.import_module(".running", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
