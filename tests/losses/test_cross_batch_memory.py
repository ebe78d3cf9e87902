import pytest
import torch
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss

from ..conftest import make_embeddings_and_labels
from ..reference_histogram_ap import fastap_reference


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
