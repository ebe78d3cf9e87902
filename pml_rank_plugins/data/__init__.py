"""Datasets (two-level labels ``[class, category]``), class-disjoint splits, image plumbing."""

from . import splits
from .glyphs import GlyphDataset
from .images import DatasetFormatError, ImageListDataset
from .labels import CATEGORY, CLASS, UNLABELED, as_two_level
from .omniglot import OmniglotDataset
from .splits import (
    LabeledSubset,
    class_disjoint_kfold,
    class_disjoint_split,
    first_half_split,
    mlrc_folds,
)

__all__ = [
    "CATEGORY",
    "CLASS",
    "UNLABELED",
    "DatasetFormatError",
    "GlyphDataset",
    "ImageListDataset",
    "LabeledSubset",
    "OmniglotDataset",
    "as_two_level",
    "class_disjoint_kfold",
    "class_disjoint_split",
    "first_half_split",
    "mlrc_folds",
    "splits",
]
