"""RankedListMiner on the gpu backend (run here on CPU): the cpu path's pairs and weights, one
host read per call (the pair counts) and no other syncing operator."""

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance

import pml_rank_plugins.functional.ranked_list.gpu_mining as mining_module
from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import use_backend
from pml_rank_plugins.miners import RankedListMiner, WeightedPairs
from pml_rank_plugins.utils.op_count import OpCounter


class OtherLp(LpDistance):
    """Another distance object (a subclass): the dense-matrix path."""


def data(n=24, dim=5, classes=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen), torch.randint(0, classes, (n,), generator=gen)


@pytest.fixture
def reads(monkeypatch):
    """Counts the miner's host reads (``host_counts`` calls)."""
    calls = []
    real = mining_module.host_counts
    monkeypatch.setattr(mining_module, "host_counts", lambda c: calls.append(1) or real(c))
    return calls


def assert_same_pairs(ours, ref):
    assert isinstance(ours, WeightedPairs)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == torch.long and torch.equal(a, b)
    torch.testing.assert_close(ours.weights, ref.weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("several_chunks", [False, True])
@pytest.mark.parametrize("kwargs", [{}, dict(Tn=0.0), dict(distance=OtherLp()), dict(chunk_size=3)])
def test_gpu_equals_cpu_with_one_host_read(several_chunks, kwargs, reads, monkeypatch):
    if several_chunks:
        monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: 2048)
    x, labels = data()
    ref = RankedListMiner(**kwargs, backend="cpu")(x, labels)
    with OpCounter() as ops:
        ours = RankedListMiner(**kwargs, backend="gpu")(x, labels)
    # the one host read (host_counts: a device-to-host copy on an accelerator, which the counter
    # sees as a syncing _to_copy; nothing on the CPU) and no other syncing operator
    one_read = {} if x.device.type == "cpu" else {"_to_copy": 1}
    assert len(reads) == 1 and dict(ops.sync_counts) == one_read, dict(ops.sync_counts)
    assert_same_pairs(ours, ref)
    assert len(ours[0]) > 0 and len(ours[2]) > 0


def test_ref_emb_and_self_index_equal_cpu(reads):
    x, labels = data(n=8, seed=1)
    mem, mem_labels = data(n=30, seed=2)
    mem[:8], mem_labels[:8] = x, labels  # the batch sits in slots 0-7
    slots = torch.arange(8)
    for kw in (dict(), dict(self_index=slots)):
        ref = RankedListMiner(backend="cpu")(x, labels, mem, mem_labels, **kw)
        with use_backend("gpu"):
            ours = RankedListMiner()(x, labels, mem, mem_labels, **kw)
        assert_same_pairs(ours, ref)
    assert len(reads) == 2


def test_self_index_values_checked_only_on_request():
    x, labels = data(n=4, seed=3)
    mem, mem_labels = data(n=6, seed=4)
    bad = torch.tensor([0, 1, 2, 9])
    with pytest.raises(ValueError, match="self_index entries"):
        RankedListMiner(backend="gpu", check_values=True)(
            x, labels, mem, mem_labels, self_index=bad
        )
    with pytest.raises(ValueError, match="self_index must have shape"):
        RankedListMiner(backend="gpu")(x, labels, mem, mem_labels, self_index=bad[:2])


def test_stats_and_empty_batch():
    x, labels = data(seed=5)
    counts = []
    for b in ("gpu", "cpu"):
        miner = RankedListMiner(backend=b, collect_stats=True)
        miner(x, labels)
        counts.append(miner.num_anchors_nothing_mined)
    assert isinstance(counts[0], torch.Tensor) and counts[0].ndim == 0
    assert counts[0].item() == counts[1]
    out = RankedListMiner(backend="gpu")(x[:0], labels[:0])
    assert all(len(t) == 0 for t in out) and len(out.weights) == 0


def test_bad_keywords_are_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        RankedListMiner(backend="gpu0")
    with pytest.raises(ValueError, match="check_values"):
        RankedListMiner(check_values=1)
