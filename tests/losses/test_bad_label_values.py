"""Bad label values and argument combinations are one clear error each, naming the argument, in
every loss, the miner and CrossBatchMemory (issue 41, item 4)."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss

from pml_rank_plugins.functional.validation import check_label_values
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from tests.conftest import TEST_DEVICE

N, D = 6, 4
NAN, INF = float("nan"), float("inf")
BAD_VALUES = {
    "nan": ([0, 1, NAN, 0, 1, 0], r"contains 1 NaN/inf value\(s\)"),
    "inf": ([0, 1, INF, 0, 1, -INF], r"contains 2 NaN/inf value\(s\)"),
    "fraction": ([0, 1, 1.5, 0, 1, 0], r"contains 1 non-integer value\(s\) \(e\.g\. 1\.5\)"),
}
BAD_SHAPES = {
    "list": ([0, 1, 0, 1, 0, 1], TypeError, "labels must be a torch.Tensor of class ids"),
    "none": (None, ValueError, "labels are required"),
    "2-D": (torch.zeros(N, 2, dtype=torch.long), ValueError, "labels must be a 1D tensor"),
    "length": (torch.arange(N - 1), ValueError, "Number of embeddings must equal number of labels"),
}
LOSSES = {
    "FastAPLoss": FastAPLoss,
    "QuantizedAPLoss": QuantizedAPLoss,
    "RankedListLoss": RankedListLoss,
}


def _emb() -> torch.Tensor:
    return torch.randn(N, D, generator=torch.Generator().manual_seed(0)).to(TEST_DEVICE)


def _labels(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=TEST_DEVICE)


def _memories() -> dict:
    return {
        "CrossBatchMemory(FastAPLoss)": CrossBatchMemory(FastAPLoss(), D, 16),
        "CrossBatchMemory(ContrastiveLoss)": CrossBatchMemory(ContrastiveLoss(), D, 16),
    }


@pytest.mark.parametrize("bad", list(BAD_VALUES))
@pytest.mark.parametrize("name", list(LOSSES))
def test_losses_refuse_bad_label_values_naming_the_argument(name, bad):
    values, message = BAD_VALUES[bad]
    good = torch.arange(N, device=TEST_DEVICE) % 2
    with pytest.raises(ValueError, match="^labels " + message):
        LOSSES[name]()(_emb(), _labels(values))
    with pytest.raises(ValueError, match="^ref_labels " + message):
        LOSSES[name]()(_emb(), good, ref_emb=_emb(), ref_labels=_labels(values))


@pytest.mark.parametrize("backend", [None, "cpu", "gpu"])
@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_miner_refuses_bad_label_values(bad, backend):
    # on every backend, like the losses (the gpu one, auto on CUDA, included)
    values, message = BAD_VALUES[bad]
    good = torch.arange(N, device=TEST_DEVICE) % 2
    with pytest.raises(ValueError, match="^labels " + message):
        RankedListMiner(backend=backend)(_emb(), _labels(values))
    with pytest.raises(ValueError, match="^ref_labels " + message):
        RankedListMiner(backend=backend)(_emb(), good, _emb(), _labels(values))


@pytest.mark.parametrize("name", [*LOSSES, "RankedListMiner"])
def test_ref_labels_without_ref_emb_is_an_error(name):
    labels = torch.arange(N, device=TEST_DEVICE) % 2
    with pytest.raises(ValueError, match="ref_labels were given without ref_emb"):
        if name == "RankedListMiner":
            RankedListMiner()(_emb(), labels, None, labels)
        else:
            LOSSES[name]()(_emb(), labels, ref_labels=labels)


@pytest.mark.parametrize("bad", [*BAD_VALUES, *BAD_SHAPES])
@pytest.mark.parametrize("name", list(_memories()))
def test_cross_batch_memory_checks_labels_before_touching_its_memory(name, bad):
    memory = _memories()[name]
    memory(_emb(), torch.arange(N, device=TEST_DEVICE) % 2)  # one good batch: 6 slots written
    before = (memory.embedding_memory.clone(), memory.label_memory.clone(), memory.queue_idx)
    if bad in BAD_VALUES:
        values, message = BAD_VALUES[bad]
        with pytest.raises(ValueError, match="^labels " + message):
            memory(_emb(), _labels(values))
    else:
        labels, error, message = BAD_SHAPES[bad]
        with pytest.raises(error, match=message):
            memory(_emb(), labels)
        with pytest.raises(error, match=message):  # the same message as the losses'
            FastAPLoss()(_emb(), labels)
    assert torch.equal(memory.embedding_memory, before[0])
    assert torch.equal(memory.label_memory, before[1]) and memory.queue_idx == before[2]


def test_check_label_values_passes_class_ids():
    check_label_values(None, "labels")
    check_label_values(torch.tensor([0, 3, 7]), "labels")  # integer dtype: nothing read
    check_label_values(torch.tensor([0.0, 3.0, -2.0]), "labels")  # integer-valued floats (PML)
    with pytest.raises(ValueError, match="^my_labels contains 1 non-integer"):
        check_label_values(torch.tensor([0.0, 0.25]), "my_labels")
