"""pml_rank_plugins: metric learning to rank (FastAP, mAP_Q/mAP_T, Ranked List Loss) for PML.

Subpackages:
    functional -- pure tensor functions (no PML dependency): histograms, AP, RLL terms.
    losses, miners, samplers, trainers -- thin PML classes over ``functional``.
    data -- datasets with two-level labels (see ``pml_rank_plugins.data.labels``).
    models -- embedding networks; config -- registry and YAML runner; cli -- ``pml-rank``.
"""

__version__ = "0.1.0"
