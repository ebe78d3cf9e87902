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
    cli -- ``pml-rank``, on top.
"""

from ._version import __version__

__all__ = ["__version__"]
