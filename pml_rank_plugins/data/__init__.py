"""Datasets (two-level labels ``[class, category]``), class-disjoint splits, image plumbing."""

from . import splits
from .cars196 import Cars196
from .cub import CUB200
from .glyphs import GlyphDataset
from .image_folder import ImageFolderDataset
from .images import DatasetFormatError, ImageListDataset
from .inshop import InShopClothes
from .labels import CATEGORY, CLASS, UNLABELED, as_two_level, encode_labels, label_names
from .landmarks import LandmarksList
from .matfile import MatFileError, load_mat
from .omniglot import OmniglotDataset
from .revisited import RevisitedOxfordParis
from .splits import (
    LabeledSubset,
    class_disjoint_kfold,
    class_disjoint_split,
    first_half_split,
    mlrc_protocol,
    query_gallery_split,
)
from .stanford_products import StanfordOnlineProducts
from .vehicle_id import VehicleID

__all__ = [
    "CATEGORY",
    "CLASS",
    "CUB200",
    "Cars196",
    "DatasetFormatError",
    "GlyphDataset",
    "ImageFolderDataset",
    "ImageListDataset",
    "InShopClothes",
    "LabeledSubset",
    "LandmarksList",
    "MatFileError",
    "OmniglotDataset",
    "RevisitedOxfordParis",
    "StanfordOnlineProducts",
    "UNLABELED",
    "VehicleID",
    "as_two_level",
    "class_disjoint_kfold",
    "class_disjoint_split",
    "encode_labels",
    "first_half_split",
    "label_names",
    "load_mat",
    "mlrc_protocol",
    "query_gallery_split",
    "splits",
]
