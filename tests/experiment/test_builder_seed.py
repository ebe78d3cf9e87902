"""The run's seed reaches the sampler: runs of a comparison that differ only in their seed see
different batches (a sampler built with a fixed seed would give every seed the same batches);
and the models are initialized from the seed alone, whatever randomness building the data used."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pml_rank_plugins.experiment import builder, registry
from tests.tiny import TinyDataset, tiny_config

SAMPLERS = {
    "RandomClassSampler": {"RandomClassSampler": {"samples_per_class": 2}},
    "CategoryHardSampler": {"CategoryHardSampler": {}},
}


def epoch_batches(seed: int, sampler: dict) -> tuple[np.ndarray, list[list[int]]]:
    cfg = tiny_config(seed=seed)
    cfg["sampler"] = sampler
    exp = builder.build_experiment(cfg)
    exp.sampler.set_epoch(1)
    return np.asarray(exp.datasets["train"].labels), [list(b) for b in exp.sampler]


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_seeds_of_a_comparison_get_different_batches(name):
    labels0, seed0 = epoch_batches(0, SAMPLERS[name])
    labels1, seed1 = epoch_batches(1, SAMPLERS[name])
    # The split has its own seed (split.class_disjoint_split.seed): the same training items, so
    # the batches can differ only through the sampler's seed.
    assert np.array_equal(labels0, labels1)
    assert len(seed0) == len(seed1) > 1
    assert seed0 != seed1
    # ... and the same seed gives the same batches (the difference is the seed, not chance).
    assert epoch_batches(1, SAMPLERS[name])[1] == seed1


class DrawingTinyDataset(TinyDataset):
    """TinyDataset that also draws ``draws`` numbers from torch's global RNG when built (as a
    user's dataset may, e.g. for random augmentation parameters)."""

    def __init__(self, draws: int = 0, **kwargs):
        super().__init__(**kwargs)
        torch.rand(draws)


@pytest.fixture
def drawing_dataset():
    registry.register("DrawingTinyDataset", DrawingTinyDataset)
    yield
    registry.unregister("DrawingTinyDataset")


def test_model_init_does_not_depend_on_the_randomness_the_data_used(drawing_dataset):
    states = []
    for draws in (0, 7):
        cfg = tiny_config()
        cfg["dataset"] = {"DrawingTinyDataset": {"draws": draws}}
        states.append(builder.build_experiment(cfg).models["trunk"].state_dict())
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key
