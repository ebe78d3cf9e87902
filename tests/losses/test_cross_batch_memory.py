import pytest
import torch
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

from ..conftest import make_embeddings_and_labels
from ..reference_histogram_ap import fastap_reference
from ..reference_ranked_list import reference_rll


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss])
def test_pml_rejects_our_losses_ours_accepts_them(loss_cls):
    with pytest.raises(Exception, match="not supported"):
        PMLCrossBatchMemory(loss_cls(), embedding_size=4, memory_size=8)
    CrossBatchMemory(loss_cls(), embedding_size=4, memory_size=8)


def test_fastap_against_memory_equals_loop_reference_without_self_pairs():
    first, first_labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=1)
    second, second_labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=2)
    memory_loss = CrossBatchMemory(FastAPLoss(), embedding_size=4, memory_size=16)
    memory_loss(first, first_labels)
    loss = memory_loss(second, second_labels)
    memory = torch.cat([first, second]).detach()
    memory_labels = torch.cat([first_labels, second_labels]).tolist()
    pos, neg = [], []
    for i, label in enumerate(second_labels.tolist()):
        for j, other in enumerate(memory_labels):
            if j == 8 + i:  # the query's own slot in the memory
                continue
            (pos if other == label else neg).append((i, j))
    want, _ = fastap_reference(
        second,
        second_labels.tolist(),
        10,
        ref_emb=memory,
        ref_labels=memory_labels,
        pairs=(pos, neg),
    )
    torch.testing.assert_close(loss, want)


def _two_batches_through_memory(memory_loss):
    first, first_labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=1)
    second, second_labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=2)
    memory_loss(first, first_labels)
    loss = memory_loss(second, second_labels)
    memory = torch.cat([first, second]).detach()
    memory_labels = torch.cat([first_labels, second_labels])
    return loss, second, second_labels, memory, memory_labels


def test_ranked_list_miner_weights_survive_the_memory():
    # Issue 12.3: PML's remove_self_comparisons returned a plain tuple, dropping the miner's
    # .weights, so RankedListLoss silently used its own Tn = 10 instead of the miner's Tn = 0.
    memory_loss = CrossBatchMemory(
        RankedListLoss(Tn=10), embedding_size=4, memory_size=16, miner=RankedListMiner(Tn=0)
    )
    loss, second, labels, memory, memory_labels = _two_batches_through_memory(memory_loss)
    (grad,) = torch.autograd.grad(loss, second)
    # Independent loop reference with uniform negative weights (Tn = 0), the query's own memory
    # slot excluded (at distance 0 it is never a non-trivial positive anyway).
    e = second.detach().clone().requires_grad_(True)
    own_slot = {(i, 8 + i) for i in range(8)}
    allowed_pos = {(i, j) for i in range(8) for j in range(16)} - own_slot
    per_query = reference_rll(e, labels, memory, memory_labels, Tn=0.0, allowed_pos=allowed_pos)
    want = torch.stack(per_query).mean()
    (want_grad,) = torch.autograd.grad(want, e)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, want_grad)
    with_tn10 = torch.stack(
        reference_rll(e, labels, memory, memory_labels, Tn=10.0, allowed_pos=allowed_pos)
    ).mean()
    assert abs(with_tn10.item() - want.item()) > 1e-3  # the test can tell the two apart


def test_weighted_pairs_with_an_extra_indices_tuple_are_refused():
    memory_loss = CrossBatchMemory(
        RankedListLoss(), embedding_size=4, memory_size=16, miner=RankedListMiner()
    )
    emb, labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=1)
    extra = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="weights.*indices_tuple"):
        memory_loss(emb, labels, indices_tuple=extra)


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss])
def test_batch_larger_than_memory_is_a_clear_error(loss_cls):
    memory_loss = CrossBatchMemory(loss_cls(), embedding_size=4, memory_size=6)
    emb, labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=1)
    with pytest.raises(ValueError, match=r"batch of 8 embeddings.*memory_size=6"):
        memory_loss(emb, labels)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[:7] = True
    with pytest.raises(ValueError, match=r"enqueue 7 embeddings.*memory_size=6"):
        memory_loss(emb, labels, enqueue_mask=mask)


def test_embedding_width_must_match_the_memory():
    memory_loss = CrossBatchMemory(FastAPLoss(), embedding_size=5, memory_size=16)
    emb, labels = make_embeddings_and_labels(n=8, dim=4, num_classes=4, seed=1)
    with pytest.raises(ValueError, match=r"embeddings of width 4.*embedding_size=5"):
        memory_loss(emb, labels)


@pytest.mark.parametrize(
    "kwargs", [dict(memory_size=0), dict(memory_size=8.0), dict(embedding_size=True)]
)
def test_sizes_must_be_positive_integers(kwargs):
    args = dict(embedding_size=4, memory_size=8) | kwargs
    with pytest.raises(ValueError, match=r"(memory_size|embedding_size) must be an integer >= 1"):
        CrossBatchMemory(FastAPLoss(), **args)
