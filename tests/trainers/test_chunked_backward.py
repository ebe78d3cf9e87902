import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import MultiSimilarityLoss, ProxyAnchorLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.trainers import chunked_backward
from tests.conftest import rng_states, same_rng_states

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


def per_chunk_reference(model, loss_fn, x, y, sizes):
    """Plain autograd with the model run on the given consecutive chunk sizes."""
    model.zero_grad()
    loss_fn.zero_grad()
    emb = torch.cat([model(part) for part in torch.split(x, sizes)])
    loss = loss_fn(emb, y)
    loss.backward()
    params = [p for p in [*model.parameters(), *loss_fn.parameters()] if p.requires_grad]
    return loss.detach(), [p.grad.clone() for p in params]


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


# 26 items in chunks of at most 6: chunked_backward runs five balanced chunks of 6, 5, 5, 5, 5.
# The reference must run the model on the same chunks: the CPU generator gives the same dropout
# masks however a batch is cut (one sequential stream), but CUDA's Philox generator advances its
# offset by a rounded amount per kernel launch, so chunks of 6, 6, 6, 6, 2 draw other masks there
# (the gradients then differed by 0.14 on an H200: the reference was wrong, not the replay).
DROPOUT_CHUNKS = [6, 5, 5, 5, 5]


def test_dropout_replays_the_same_masks():
    x, y = data()
    model = mlp(torch.nn.Dropout(0.5))
    loss_fn = FastAPLoss()
    torch.manual_seed(7)  # every device's generator
    _, want = per_chunk_reference(model, loss_fn, x, y, DROPOUT_CHUNKS)
    rng_after_reference = rng_states()  # the CPU's and, on CUDA, every GPU's
    model.zero_grad()
    torch.manual_seed(7)
    chunked_backward(model, x, y, loss_fn, 6, check_replay=True)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    # the RNGs of every device advanced once per step
    assert same_rng_states(rng_states(), rng_after_reference)


class DrawingLoss(FastAPLoss):
    """FastAP that also draws from the global RNG (as a loss with random sampling would)."""

    def forward(self, embeddings, labels=None, indices_tuple=None, *args, **kwargs):
        torch.rand(3)
        return super().forward(embeddings, labels, indices_tuple, *args, **kwargs)


def test_a_loss_that_draws_random_numbers_leaves_the_rng_as_a_plain_step():
    # The loss draws from the global RNG after the embedding pass: the chunked step must end
    # with the RNG where a plain step leaves it (after the loss's draws), not where the replay
    # of the last chunk leaves it.
    x, y = data()
    model = mlp(torch.nn.Dropout(0.5))
    noisy_loss = DrawingLoss()
    torch.manual_seed(7)
    _, want = per_chunk_reference(model, noisy_loss, x, y, DROPOUT_CHUNKS)
    rng_after_reference = rng_states()
    model.zero_grad()
    torch.manual_seed(7)
    chunked_backward(model, x, y, noisy_loss, 6, check_replay=True)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    assert same_rng_states(rng_states(), rng_after_reference)
    # and the next draw (on the test device) is the one a plain step's caller would get
    torch.manual_seed(7)
    per_chunk_reference(model, noisy_loss, x, y, DROPOUT_CHUNKS)
    after_plain = torch.rand(4)
    torch.manual_seed(7)
    chunked_backward(model, x, y, noisy_loss, 6)
    assert torch.equal(torch.rand(4), after_plain)


def test_batchnorm_uses_chunk_statistics_and_updates_running_stats_once():
    x, y = data()
    model = mlp(torch.nn.BatchNorm1d(16))
    reference = mlp(torch.nn.BatchNorm1d(16))
    loss_fn = FastAPLoss()
    # 26 items in chunks of at most 8: four balanced chunks of 7, 7, 6, 6.
    _, want = per_chunk_reference(reference, loss_fn, x, y, [7, 7, 6, 6])
    chunked_backward(model, x, y, loss_fn, 8)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    for (name, b), (_, rb) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=0, atol=0, msg=name)
    assert int(dict(model.named_buffers())["1.num_batches_tracked"]) == 4


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


# -- issue 12.12 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, chunk_size, sizes",
    [(13, 4, [4, 3, 3, 3]), (26, 8, [7, 7, 6, 6]), (9, 4, [3, 3, 3]), (8, 4, [4, 4]), (5, 9, [5])],
)
def test_chunks_are_balanced(n, chunk_size, sizes):
    from pml_rank_plugins.trainers.chunked_backward import balanced_chunk_sizes

    assert balanced_chunk_sizes(n, chunk_size) == sizes


def test_batchnorm_with_a_last_chunk_of_one_item_works():
    # Batch 13 in chunks of 4 used to leave a last chunk of one item, which BatchNorm refuses in
    # training mode although the plain step works. Balanced chunks are 4, 3, 3, 3.
    x, y = data()
    x, y = x[:13], y[:13]
    model = mlp(torch.nn.BatchNorm1d(16))
    reference = mlp(torch.nn.BatchNorm1d(16))
    loss_fn = FastAPLoss()
    want_loss, want = per_chunk_reference(reference, loss_fn, x, y, [4, 3, 3, 3])
    loss = chunked_backward(model, x, y, loss_fn, 4, check_replay=True)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=0, atol=1e-10)
    for (name, b), (_, rb) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=0, atol=0, msg=name)


def test_frozen_model_with_a_loss_that_has_parameters():
    x, y = data()
    model = mlp(torch.nn.BatchNorm1d(16)).requires_grad_(False)
    reference = mlp(torch.nn.BatchNorm1d(16)).requires_grad_(False)
    loss_fn = ProxyAnchorLoss(5, DIM_OUT).double()
    want_loss, (want_proxies,) = per_chunk_reference(reference, loss_fn, x, y, [7, 7, 6, 6])
    loss_fn.zero_grad()
    loss = chunked_backward(model, x, y, loss_fn, 8)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(loss_fn.proxies.grad, want_proxies, rtol=0, atol=1e-12)
    assert all(p.grad is None for p in model.parameters())
    for (name, b), (_, rb) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=0, atol=0, msg=name)


def test_non_finite_embeddings_are_reported_with_their_chunk():
    x, y = data()
    x[9, 2] = float("nan")  # item 9 is in the second chunk (items 7-13) of 26 by 8
    with pytest.raises(ValueError, match=r"chunk 1 \(items 7-13\).*non-finite embeddings.*row 9"):
        chunked_backward(mlp(), x, y, MultiSimilarityLoss(), 8)


def test_non_finite_embedding_gradients_are_reported_with_their_chunk():
    # A finite loss whose gradient is NaN: d sqrt(e) / d e is NaN below 0, and torch.where's
    # masking multiplies it by 0 (0 * NaN = NaN).
    def loss_fn(emb, labels, indices_tuple=None):
        return torch.where(emb > 0, emb.clamp_min(-1).sqrt(), 0).sum() * 0 + emb.pow(2).mean()

    x, y = data()
    with torch.no_grad():
        assert torch.isfinite(loss_fn(mlp()(x), y))
    with pytest.raises(ValueError, match=r"gradient of the loss .* non-finite .* chunk \d+"):
        chunked_backward(mlp(), x, y, loss_fn, 8)
