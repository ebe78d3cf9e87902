"""Drop-in signatures (issue 21, build item 1): PML's positional order and keywords mean the same
here, or fail with an error that says what to use."""

import inspect
import warnings

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.losses import CrossBatchMemory as PMLCrossBatchMemory
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss
from pytorch_metric_learning.losses import RankedListLoss as PMLRankedListLoss
from pytorch_metric_learning.reducers import BaseReducer

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner

from ..conftest import make_embeddings_and_labels


class PerQuery(BaseReducer):
    """Test reducer: hands back the per-query element losses unreduced."""

    def element_reduction(self, losses, *_):
        return losses


class DenseLp(LpDistance):
    """An ``LpDistance`` subclass: the loss calls it as is, so the dense kernel runs."""


def batch(seed=0, n=32, dim=8):
    return make_embeddings_and_labels(n=n, dim=dim, num_classes=4, seed=seed)


def value_and_grad(loss_fn, x, labels):
    loss = loss_fn(x, labels)
    return loss.detach(), torch.autograd.grad(loss, x)[0]


def pml_rll(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PML warns for any temperature > 5
        return PMLRankedListLoss(*args, **kwargs)


# -- RankedListLoss ----------------------------------------------------------------------------


def test_positional_margin_tn_equals_keywords_values_and_gradients():
    x, labels = batch()
    positional = RankedListLoss(0.4, 10)
    assert (positional.margin, positional.Tn, positional.alpha, positional.lam) == (
        0.4,
        10.0,
        1.2,
        1.0,
    )
    got, got_grad = value_and_grad(positional, x, labels)
    want, want_grad = value_and_grad(RankedListLoss(margin=0.4, Tn=10), x, labels)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)


def test_positional_call_no_longer_sets_alpha_10():
    # The trap: the old order (margin, alpha, Tn) read RankedListLoss(0.4, 10) as
    # alpha=10, mining every negative (loss about 8.9 instead of under 1).
    x, labels = batch()
    loss = RankedListLoss(0.4, 10)(x, labels)
    old_meaning = RankedListLoss(margin=0.4, alpha=10.0)(x, labels)
    assert loss < 1.5
    assert old_meaning > 8.0


def test_every_pml_positional_argument_equals_its_keyword():
    x, labels = batch(seed=1)
    positional = RankedListLoss(0.3, 5.0, 0.25, 1.3, 2.0)
    keywords = RankedListLoss(margin=0.3, Tn=5.0, imbalance=0.25, alpha=1.3, Tp=2.0)
    for name in ("margin", "Tn", "imbalance", "alpha", "Tp", "lam", "lam_pos"):
        assert getattr(positional, name) == getattr(keywords, name), name
    got, got_grad = value_and_grad(positional, x, labels)
    want, want_grad = value_and_grad(keywords, x, labels)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
    pml_names = list(inspect.signature(PMLRankedListLoss).parameters)[:5]
    assert list(inspect.signature(RankedListLoss).parameters)[:5] == pml_names


@pytest.mark.parametrize("distance", [None, DenseLp()], ids=["chunked", "dense"])
@pytest.mark.parametrize("b", [0.0, 0.25, 0.5, 0.9])
def test_imbalance_is_one_minus_b_times_lam_b_over_one_minus_b(b, distance):
    # PML: (1 - b) L_P + b L_N = (1 - b) (L_P + b / (1 - b) L_N): same minimizer, and the loss
    # and gradients are exactly (1 - b) times those with lam = b / (1 - b).
    x, labels = batch(seed=2)
    extra = {} if distance is None else {"distance": distance}
    got, got_grad = value_and_grad(RankedListLoss(0.4, 10, imbalance=b, **extra), x, labels)
    want, want_grad = value_and_grad(RankedListLoss(0.4, 10, lam=b / (1 - b), **extra), x, labels)
    torch.testing.assert_close(got, (1 - b) * want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got_grad, (1 - b) * want_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("distance", [None, DenseLp()], ids=["chunked", "dense"])
def test_imbalance_one_keeps_only_the_negative_term(distance):
    # b = 1 has no lam equivalent (lam = inf): it is L_N alone, = L(lam=1) - L(lam=0) per query.
    x, labels = batch(seed=3)
    extra = (
        {"reducer": PerQuery()}
        if distance is None
        else {"reducer": PerQuery(), "distance": distance}
    )
    only_neg = RankedListLoss(imbalance=1.0, **extra)(x, labels)
    both = RankedListLoss(lam=1.0, **extra)(x, labels)
    pos = RankedListLoss(lam=0.0, **extra)(x, labels)
    torch.testing.assert_close(only_neg, both - pos, rtol=1e-12, atol=1e-14)
    g = torch.autograd.grad(only_neg.sum(), x)[0]
    torch.testing.assert_close(g, torch.autograd.grad((both - pos).sum(), x)[0])


def test_values_relate_to_pmls_as_documented():
    # docs/ranked-list.md: the forward values agree up to PML's epsilon (the weights are the same
    # normalized exp(Tn (alpha - d)); only their gradient differs), so imbalance=0.5 matches PML's
    # RankedListLoss(0.4, 10) and the paper's lam=1 is twice it.
    x, labels = batch(seed=4)
    pml = pml_rll(0.4, 10)(x, labels)
    torch.testing.assert_close(
        RankedListLoss(0.4, 10, imbalance=0.5)(x, labels), pml, rtol=2e-3, atol=0
    )
    torch.testing.assert_close(RankedListLoss(0.4, 10)(x, labels), 2 * pml, rtol=2e-3, atol=0)
    default_pml = pml_rll(0.8, 10)
    assert RankedListLoss(margin=0.8).alpha == default_pml.alpha == 1.4  # alpha = 1 + margin / 2


def test_imbalance_and_lam_together_name_both():
    with pytest.raises(
        ValueError, match=r"either imbalance .* or lam .* not both.*lam=b / \(1 - b\)"
    ):
        RankedListLoss(0.4, 10, imbalance=0.5, lam=1.0)


@pytest.mark.parametrize("imbalance", [1.5, -0.1, True, float("nan")])
def test_bad_imbalance_raises_naming_it(imbalance):
    with pytest.raises(ValueError, match="imbalance"):
        RankedListLoss(0.4, 10, imbalance)


def test_old_positional_order_fails_loudly():
    # (margin, alpha, Tn) = (0.4, 1.2, 10) now reads imbalance=10: refused, with the order.
    with pytest.raises(ValueError, match=r"imbalance must be in \[0, 1\].*margin, Tn, imbalance"):
        RankedListLoss(0.4, 1.2, 10)


def test_lam_is_keyword_only():
    with pytest.raises(TypeError):
        RankedListLoss(0.4, 10, None, 1.2, 0.0, 1.0)


# -- RankedListMiner ---------------------------------------------------------------------------


def test_miner_positional_margin_tn_mirror_the_loss():
    x, labels = batch(seed=5)
    positional, keywords = RankedListMiner(0.4, 10), RankedListMiner(margin=0.4, Tn=10)
    assert (positional.margin, positional.Tn, positional.alpha) == (0.4, 10.0, 1.2)
    for got, want in zip(positional(x, labels), keywords(x, labels)):
        assert torch.equal(got, want)
    assert torch.equal(positional(x, labels).weights, keywords(x, labels).weights)
    assert RankedListMiner(margin=0.8).alpha == RankedListLoss(margin=0.8).alpha == 1.4
    with pytest.raises(TypeError):
        RankedListMiner(0.4, 10, 1.2)  # alpha is keyword-only (the loss's third is imbalance)


# -- FastAPLoss, CrossBatchMemory ---------------------------------------------------------------


def test_fastap_pml_positional_num_bins():
    x, labels = batch(seed=6)
    assert list(inspect.signature(FastAPLoss).parameters)[0] == "num_bins"
    got, got_grad = value_and_grad(FastAPLoss(20), x, labels)
    want, want_grad = value_and_grad(FastAPLoss(num_bins=20), x, labels)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
    torch.testing.assert_close(got, PMLFastAPLoss(20)(x, labels), rtol=1e-9, atol=1e-12)


def test_cross_batch_memory_pml_positional_order():
    # PML: CrossBatchMemory(loss, embedding_size, memory_size=1024, miner=None).
    miner = RankedListMiner()
    ours = CrossBatchMemory(RankedListLoss(), 8, 64, miner)
    pml = PMLCrossBatchMemory(ContrastiveLoss(), 8, 64, miner)
    assert (
        (ours.embedding_size, ours.memory_size) == (pml.embedding_size, pml.memory_size) == (8, 64)
    )
    assert ours.miner is pml.miner is miner
    names = list(inspect.signature(CrossBatchMemory).parameters)[:4]
    assert names == list(inspect.signature(PMLCrossBatchMemory).parameters)[:4]
    x, labels = batch(seed=7)
    assert torch.isfinite(ours(x, labels))


@pytest.mark.parametrize("loss_cls", [FastAPLoss, QuantizedAPLoss, RankedListLoss])
def test_pmls_memory_refusal_is_discoverable_from_our_class(loss_cls):
    # PML's CrossBatchMemory refuses our classes by name; the class docstring says what to use.
    with pytest.raises(Exception, match=f"not supported for {loss_cls.__name__}"):
        PMLCrossBatchMemory(loss_cls(), 8)
    assert "pml_rank_plugins.losses.CrossBatchMemory" in loss_cls.__doc__
    CrossBatchMemory(loss_cls(), 8)


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_imbalance_chunked_sparse_and_dense_chunks_equal_the_dense_kernel(gallery_gradient):
    # Tight clusters: with chunk_size=16 most chunks mine <= 1/32 of their pairs (sparse path),
    # some more (dense path); both must apply lam_pos = 1 - b to the positives' gradient.
    n, labels = 128, torch.arange(128) % 4
    gen = torch.Generator().manual_seed(0)
    noise = 0.1 * torch.randn(n, 8, generator=gen, dtype=torch.float64)
    x = (torch.eye(8, dtype=torch.float64)[labels] + noise).requires_grad_()
    kwargs = dict(imbalance=0.3, alpha=1.2, gallery_gradient=gallery_gradient, reducer=PerQuery())
    chunked = RankedListLoss(0.7, 10, chunk_size=16, **kwargs)(x, labels)
    dense = RankedListLoss(0.7, 10, distance=DenseLp(), **kwargs)(x, labels)
    torch.testing.assert_close(chunked, dense, rtol=1e-12, atol=1e-14)
    assert (chunked > 0).sum() > n // 2
    upstream = torch.rand(n, dtype=torch.float64, generator=gen)
    g_chunked = torch.autograd.grad(chunked, x, upstream)[0]
    g_dense = torch.autograd.grad(dense, x, upstream)[0]
    torch.testing.assert_close(g_chunked, g_dense, rtol=1e-10, atol=1e-12)
