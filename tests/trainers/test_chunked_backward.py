import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import MultiSimilarityLoss, ProxyAnchorLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.trainers import chunked_backward

N, DIM_IN, DIM_OUT = 26, 6, 8


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, DIM_IN, generator=gen, dtype=torch.float64)
    y = torch.arange(N) % 5
    return x, y


def mlp(*extra):
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM_IN, 16), *extra, torch.nn.Tanh(), torch.nn.Linear(16, DIM_OUT)
    ).double()


LOSSES = {
    "FastAP": lambda: (FastAPLoss(), None),
    "QuantizedAP": lambda: (QuantizedAPLoss(tie_aware=True, class_balanced=True), None),
    "RankedList": lambda: (RankedListLoss(), None),
    "PML MultiSimilarity + miner": lambda: (MultiSimilarityLoss(), MultiSimilarityMiner(0.5)),
    "PML ProxyAnchor (loss parameters)": lambda: (
        ProxyAnchorLoss(5, DIM_OUT).double(),
        None,
    ),
}


def reference_grads(model, loss_fn, miner, x, y, chunk=None):
    """Full-batch backward; with ``chunk``, the model runs chunk by chunk (per-chunk BatchNorm)."""
    model.zero_grad()
    loss_fn.zero_grad()
    parts = [model(x[i : i + chunk]) for i in range(0, len(x), chunk)] if chunk else [model(x)]
    emb = torch.cat(parts)
    loss = loss_fn(emb, y, miner(emb, y) if miner else None)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in [*model.parameters(), *loss_fn.parameters()]]


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 100])
def test_gradients_equal_full_batch(name, chunk_size):
    x, y = data()
    model = mlp()
    loss_fn, miner = LOSSES[name]()
    want_loss, want = reference_grads(model, loss_fn, miner, x, y)
    model.zero_grad()
    loss_fn.zero_grad()
    loss = chunked_backward(model, x, y, loss_fn, chunk_size, miner=miner, check_replay=True)
    got = [p.grad for p in [*model.parameters(), *loss_fn.parameters()]]
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    assert len(got) == len(want) and all(g is not None for g in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_dropout_replays_the_same_masks():
    x, y = data()
    model = mlp(torch.nn.Dropout(0.5))
    loss_fn = FastAPLoss()
    torch.manual_seed(7)
    _, want = reference_grads(model, loss_fn, None, x, y, chunk=6)
    rng_after_reference = torch.get_rng_state()
    model.zero_grad()
    torch.manual_seed(7)
    chunked_backward(model, x, y, loss_fn, 6, check_replay=True)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    assert torch.equal(torch.get_rng_state(), rng_after_reference)  # RNG advanced once per step


def test_batchnorm_uses_chunk_statistics_and_updates_running_stats_once():
    x, y = data()
    model = mlp(torch.nn.BatchNorm1d(16))
    reference = mlp(torch.nn.BatchNorm1d(16))
    loss_fn = FastAPLoss()
    _, want = reference_grads(reference, loss_fn, None, x, y, chunk=8)
    chunked_backward(model, x, y, loss_fn, 8)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    for (name, b), (_, rb) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=0, atol=0, msg=name)
    assert int(dict(model.named_buffers())["1.num_batches_tracked"]) == 4  # 26 items / 8 = 4 chunks


def test_replay_check_catches_a_nondeterministic_model():
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.randn(x.shape, dtype=x.dtype, generator=gen)

    gen = torch.Generator().manual_seed(0)  # a private generator escapes the RNG replay
    x, y = data()
    with pytest.raises(RuntimeError, match="replayed embeddings differ"):
        chunked_backward(Noisy(), x, y, FastAPLoss(), 5, check_replay=True)


def test_batch_smaller_than_a_chunk():
    x, y = data()
    model = mlp()
    _, want = reference_grads(model, FastAPLoss(), None, x, y)
    model.zero_grad()
    chunked_backward(model, x, y, FastAPLoss(), 1000)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [0, -2, 1.5, True])
def test_bad_chunk_size(chunk_size):
    x, y = data()
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        chunked_backward(mlp(), x, y, FastAPLoss(), chunk_size)


def test_numpy_integer_chunk_size():
    x, y = data()
    model = mlp()
    _, want = reference_grads(model, FastAPLoss(), None, x, y)
    model.zero_grad()
    chunked_backward(model, x, y, FastAPLoss(), np.int64(5))
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-12)


def test_empty_batch():
    with pytest.raises(ValueError, match="empty batch"):
        chunked_backward(
            mlp(), torch.zeros(0, DIM_IN, dtype=torch.float64), torch.zeros(0), FastAPLoss(), 4
        )


def test_loss_without_gradient_keeps_running_stats_of_one_pass():
    x, _ = data()
    model = mlp(torch.nn.BatchNorm1d(16))
    single_class = torch.zeros(N, dtype=torch.long)  # FastAP has no valid query: zero loss
    loss = chunked_backward(model, x, single_class, FastAPLoss(), 13)
    assert loss.item() == 0
    assert int(dict(model.named_buffers())["1.num_batches_tracked"]) == 2
