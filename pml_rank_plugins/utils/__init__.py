"""Helpers shared by the losses and the miners, PML's ``utils`` pattern: import the module,
:mod:`pml_rank_plugins.utils.loss_and_miner_utils`.

Import order of the package: ``functional`` <- ``utils`` <- ``losses`` / ``miners`` <-
``trainers``; ``losses`` and ``miners`` never import each other.
"""
