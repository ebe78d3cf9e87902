"""Issue 23, part 1: CrossBatchMemory's self-index path (the memory and each query's slot handed
to the loss, no indices_tuple) equals PML's path (an indices_tuple of all pairs minus the self
comparisons) in values and gradients, float64."""

import copy

import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory
from pytorch_metric_learning.miners import MultiSimilarityMiner
from pytorch_metric_learning.reducers import SumReducer
from pytorch_metric_learning.regularizers import LpRegularizer
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

from ..conftest import make_embeddings_and_labels
from .test_pml_signatures import DenseLp

DIM, MEMORY, BATCH = 6, 20, 8
# 20 slots, batches of 8: slots 0-7, 8-15 (memory still filling), 16-19 + 0-3 (wraps around),
# 4-11 (full memory).
STEPS = 4

LOSSES = {
    "fastap": lambda: FastAPLoss(num_bins=10),
    "qap": lambda: QuantizedAPLoss(num_bins=8),
    "qap_tie_balanced": lambda: QuantizedAPLoss(num_bins=8, tie_aware=True, class_balanced=True),
    "rll": lambda: RankedListLoss(Tn=3.0),
    "rll_dense": lambda: RankedListLoss(distance=DenseLp(normalize_embeddings=True)),
}


def batches(num_classes=3, seed=0, steps=STEPS):
    """``steps`` batches of float64 embeddings; 3 classes, so the memory holds many copies of
    every label."""
    return [
        make_embeddings_and_labels(n=BATCH, dim=DIM, num_classes=num_classes, seed=seed + step)
        for step in range(steps)
    ]


def pml_path(memory_loss, embeddings, labels, **kwargs):
    """Today's path: PML's forward (indices_tuple of all pairs minus self slots, built by our
    create_indices_tuple)."""
    return PMLCrossBatchMemory.forward(memory_loss, embeddings, labels, **kwargs)


def refuse_indices_tuple(memory_loss, monkeypatch):
    """Makes building an indices_tuple an error, so a test knows the self-index path ran."""

    def refused(*args, **kwargs):
        raise AssertionError("the self-index path must not build an indices_tuple")

    monkeypatch.setattr(memory_loss, "create_indices_tuple", refused)


def run_both(make_loss, monkeypatch, miner=None, masks=None, data=None):
    """Feeds the same batches through two equal memories, one per path; returns per step
    (fast loss, fast grad, PML loss, PML grad)."""
    fast = CrossBatchMemory(make_loss(), DIM, memory_size=MEMORY, miner=miner)
    slow = copy.deepcopy(fast)
    refuse_indices_tuple(fast, monkeypatch)
    results = []
    for step, (x, labels) in enumerate(data or batches()):
        kwargs = {} if masks is None else {"enqueue_mask": masks[step]}
        x_fast = x.detach().clone().requires_grad_(True)
        x_slow = x.detach().clone().requires_grad_(True)
        got = fast(x_fast, labels, **kwargs)
        want = pml_path(slow, x_slow, labels, **kwargs)
        (got_grad,) = torch.autograd.grad(got, x_fast, allow_unused=True)
        (want_grad,) = torch.autograd.grad(want, x_slow, allow_unused=True)
        results.append((got, got_grad, want, want_grad))
    torch.testing.assert_close(fast.embedding_memory, slow.embedding_memory, rtol=0, atol=0)
    torch.testing.assert_close(fast.label_memory, slow.label_memory, rtol=0, atol=0)
    assert (fast.queue_idx, fast.has_been_filled) == (slow.queue_idx, slow.has_been_filled)
    return results


def assert_equal_steps(results):
    for got, got_grad, want, want_grad in results:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        if want_grad is None:
            assert got_grad is None or not got_grad.any()
        else:
            torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", LOSSES)
def test_values_and_gradients_equal_pml_path_before_and_after_wrapping(name, monkeypatch):
    results = run_both(LOSSES[name], monkeypatch)
    assert_equal_steps(results)
    assert any(got.item() > 0 for got, *_ in results)  # a non-trivial loss was compared


@pytest.mark.parametrize("name", ["fastap", "rll", "rll_dense"])
def test_with_ranked_list_miner_equals_pml_path(name, monkeypatch):
    results = run_both(LOSSES[name], monkeypatch, miner=RankedListMiner(Tn=2.0))
    assert_equal_steps(results)
    assert any(got.item() > 0 for got, *_ in results)


def test_miner_pairs_and_weights_equal_pml_path_after_self_removal():
    x, labels = make_embeddings_and_labels(n=BATCH, dim=DIM, num_classes=3, seed=5)
    memory, memory_labels = make_embeddings_and_labels(n=16, dim=DIM, num_classes=3, seed=6)
    memory = memory.detach().clone()
    slots = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
    memory[slots] = x.detach()
    memory_labels = memory_labels.clone()
    memory_labels[slots] = labels
    miner = RankedListMiner(margin=0.4, alpha=1.2, Tn=2.0)
    got = miner(x, labels, memory, memory_labels, self_index=slots)
    # Today's path: mine every pair, then PML's removal of the self comparisons.
    everything = miner(x, labels, memory, memory_labels)
    want = lmu.remove_self_comparisons(everything, slots, len(memory))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    torch.testing.assert_close(got.weights, everything.weights, rtol=0, atol=0)
    assert not (got[1] == slots[got[0]]).any()  # no query is paired with its own slot
    assert len(got[0]) > 0 and len(got[2]) > 0


def test_enqueue_mask_equals_pml_path(monkeypatch):
    masks = [torch.tensor([True, False] * 4), torch.tensor([False] * 6 + [True] * 2)] * 2
    for name in ("fastap", "qap", "rll"):
        results = run_both(LOSSES[name], monkeypatch, masks=masks)
        assert_equal_steps(results)
    results = run_both(LOSSES["rll"], monkeypatch, miner=RankedListMiner(), masks=masks)
    assert_equal_steps(results)


def test_duplicate_embeddings_in_the_memory_only_the_own_slot_is_left_out(monkeypatch):
    # The same batch enqueued three times: every query has exact copies in other slots (ties
    # at distance 0 with its own label) that stay in its list; only its own slot is left out.
    x, labels = make_embeddings_and_labels(n=BATCH, dim=DIM, num_classes=2, seed=3)
    for name in ("fastap", "qap", "rll"):
        assert_equal_steps(run_both(LOSSES[name], monkeypatch, data=[(x, labels)] * 3))


def test_single_embedding_batch_leaves_its_own_slot_out(monkeypatch):
    # PML 2.9's remove_self_comparisons keeps the self pair of a one-row batch (its start and
    # end slots coincide); the self-index path leaves it out: check against the loss on the
    # memory without that slot.
    memory_loss = CrossBatchMemory(FastAPLoss(), DIM, memory_size=MEMORY)
    refuse_indices_tuple(memory_loss, monkeypatch)
    first, first_labels = make_embeddings_and_labels(n=BATCH, dim=DIM, num_classes=2, seed=1)
    memory_loss(first, first_labels)
    x, label = first[:1].detach().clone().requires_grad_(True), first_labels[:1]
    got = memory_loss(x, label)
    want = FastAPLoss()(x, label, ref_emb=first.detach(), ref_labels=first_labels)
    torch.testing.assert_close(got, want)
    with_self = FastAPLoss()(
        x,
        label,
        ref_emb=torch.cat([first.detach(), x.detach()]),
        ref_labels=first_labels[[*range(BATCH), 0]],
    )
    assert abs(with_self.item() - want.item()) > 1e-6  # the test tells the two apart


def test_regularizer_and_reducer_equal_pml_path(monkeypatch):
    def make_loss():
        return FastAPLoss(embedding_regularizer=LpRegularizer(), reducer=SumReducer())

    assert_equal_steps(run_both(make_loss, monkeypatch))


def test_pml_loss_through_our_class_equals_pml_class():
    ours = CrossBatchMemory(
        ContrastiveLoss(), DIM, memory_size=MEMORY, miner=MultiSimilarityMiner()
    )
    theirs = PMLCrossBatchMemory(
        ContrastiveLoss(), DIM, memory_size=MEMORY, miner=MultiSimilarityMiner()
    )
    for x, labels in batches():
        got = ours(x, labels)
        (got_grad,) = torch.autograd.grad(got, x)
        want = theirs(x, labels)
        (want_grad,) = torch.autograd.grad(want, x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
    assert ours.queue_idx == theirs.queue_idx and ours.has_been_filled


@pytest.mark.parametrize(
    "loss, miner, extra",
    [
        (ContrastiveLoss(), None, False),  # PML's loss
        (FastAPLoss(), MultiSimilarityMiner(), False),  # another miner
        (RankedListLoss(), None, True),  # an extra indices_tuple
    ],
    ids=["pml_loss", "pml_miner", "extra_indices_tuple"],
)
def test_other_cases_keep_pml_path(loss, miner, extra, monkeypatch):
    memory_loss = CrossBatchMemory(loss, DIM, memory_size=MEMORY, miner=miner)
    calls = []
    original = memory_loss.create_indices_tuple
    monkeypatch.setattr(
        memory_loss, "create_indices_tuple", lambda *a: calls.append(1) or original(*a)
    )
    x, labels = batches(steps=1)[0]
    indices_tuple = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2])) if extra else None
    memory_loss(x, labels, indices_tuple=indices_tuple)
    assert calls == [1]


def test_self_index_of_the_loss_is_checked():
    x, labels = make_embeddings_and_labels(n=4, dim=DIM, num_classes=2, seed=0)
    ref = x.detach()
    # self_index values are value checks: opt-in on the gpu backend (auto on CUDA)
    loss = RankedListLoss(check_values=True)
    with pytest.raises(ValueError, match=r"self_index\[\d\] = \d is not query \d's own column"):
        loss(x, labels, ref_emb=ref, ref_labels=labels, self_index=torch.tensor([1, 0, 3, 2]))
    with pytest.raises(ValueError, match=r"columns in \[0, 4\)"):
        loss(x, labels, ref_emb=ref, ref_labels=labels, self_index=torch.tensor([0, 1, 2, 4]))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        loss(x, labels, ref_emb=ref, ref_labels=labels, self_index=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer column indices"):
        loss(x, labels, ref_emb=ref, ref_labels=labels, self_index=torch.zeros(4))
    with pytest.raises(ValueError, match="self_index and indices_tuple are exclusive"):
        pairs = (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([2]))
        FastAPLoss()(x, labels, pairs, ref, labels, self_index=torch.arange(4))
    with pytest.raises(ValueError, match="pass labels, ref_emb and ref_labels"):
        FastAPLoss()(x, labels, self_index=torch.arange(4))
    with pytest.raises(ValueError, match="pass ref_emb and ref_labels"):
        RankedListMiner()(x, labels, self_index=torch.arange(4))


def test_self_index_of_the_diagonal_equals_the_batch_against_itself():
    x, labels = make_embeddings_and_labels(n=12, dim=DIM, num_classes=3, seed=2)
    for make_loss in LOSSES.values():
        got = make_loss()(
            x, labels, ref_emb=x.detach(), ref_labels=labels, self_index=torch.arange(12)
        )
        # The same lists as all pairs of the batch minus its diagonal, the gallery detached.
        all_pairs = lmu.get_all_pairs_indices(labels, labels)
        a1, p = all_pairs[0], all_pairs[1]
        keep = a1 != p
        pairs = (a1[keep], p[keep], all_pairs[2], all_pairs[3])
        want = make_loss()(x, labels, pairs, x.detach(), labels)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


class LegacyFastAP(FastAPLoss):
    """A user subclass whose compute_loss predates self_index."""

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        return super().compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)


def test_subclass_without_self_index_keeps_pml_path(monkeypatch):
    memory_loss = CrossBatchMemory(FastAPLoss(), DIM, memory_size=MEMORY)
    # PML's allow-list goes by class name, so such a subclass gets in by replacing the loss.
    memory_loss.loss = LegacyFastAP()
    calls = []
    original = memory_loss.create_indices_tuple
    monkeypatch.setattr(
        memory_loss, "create_indices_tuple", lambda *a: calls.append(1) or original(*a)
    )
    reference = CrossBatchMemory(FastAPLoss(), DIM, memory_size=MEMORY)
    for x, labels in batches(steps=2):
        torch.testing.assert_close(memory_loss(x, labels), reference(x, labels))
    assert calls == [1, 1]
