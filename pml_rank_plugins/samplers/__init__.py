"""Class-structured batch samplers (``torch.utils.data.BatchSampler`` subclasses)."""

from .category_hard import CategoryHardSampler
from .labeled_unlabeled import LabeledUnlabeledSampler
from .random_class import RandomClassSampler

__all__ = ["CategoryHardSampler", "LabeledUnlabeledSampler", "RandomClassSampler"]
