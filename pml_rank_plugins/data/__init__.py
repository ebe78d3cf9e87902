"""Datasets with two-level labels (see :mod:`pml_rank_plugins.data.labels`) and splits."""

from .glyphs import GlyphDataset
from .labels import as_two_level
from .omniglot import OmniglotDataset
from .splits import LabeledSubset, class_disjoint_kfold, class_disjoint_split, mlrc_protocol

__all__ = [
    "GlyphDataset",
    "LabeledSubset",
    "OmniglotDataset",
    "as_two_level",
    "class_disjoint_kfold",
    "class_disjoint_split",
    "mlrc_protocol",
]
