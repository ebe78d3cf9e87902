import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner
from torch.autograd import gradcheck

from pml_rank_plugins.losses import FastAPLoss

from ..conftest import make_embeddings_and_labels
from ..reference_histogram_ap import fastap_reference

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}


@pytest.mark.parametrize("num_bins", [1, 4, 10])
def test_value_and_gradient_match_loop_reference(dtype, num_bins):
    emb, labels = make_embeddings_and_labels(n=16, dim=5, num_classes=3, dtype=dtype)
    loss = FastAPLoss(num_bins)(emb, labels)
    (grad,) = torch.autograd.grad(loss, emb)
    ref_emb = emb.detach().double().requires_grad_(True)
    want, _ = fastap_reference(ref_emb, labels.tolist(), num_bins)
    (want_grad,) = torch.autograd.grad(want, ref_emb)
    torch.testing.assert_close(loss.double(), want, **TOL[dtype])
    torch.testing.assert_close(grad.double(), want_grad, **TOL[dtype])


@pytest.mark.parametrize("num_bins", [3, 10, 27])
def test_value_and_gradient_equal_pml_fastap(dtype, num_bins):
    emb, labels = make_embeddings_and_labels(n=64, dim=16, num_classes=9, dtype=dtype, seed=4)
    ours = FastAPLoss(num_bins)(emb, labels)
    pml = PMLFastAPLoss(num_bins)(emb, labels)
    torch.testing.assert_close(ours, pml, rtol=1e-5, atol=1e-5)
    # Same function, so the same gradient (away from kinks, which random inputs avoid).
    (ours_grad,) = torch.autograd.grad(ours, emb)
    (pml_grad,) = torch.autograd.grad(pml, emb)
    torch.testing.assert_close(ours_grad, pml_grad, rtol=1e-4, atol=1e-7)


def test_gradcheck_float64():
    emb, labels = make_embeddings_and_labels(n=12, dim=4, num_classes=3, seed=1)
    assert gradcheck(lambda e: FastAPLoss(5)(e, labels), (emb,))
    assert gradcheck(lambda e: FastAPLoss(5, chunk_size=5)(e, labels), (emb,))


def test_ref_emb_equals_hand_computation():
    emb, labels = make_embeddings_and_labels(n=10, dim=4, num_classes=3, seed=2)
    ref, ref_labels = make_embeddings_and_labels(n=14, dim=4, num_classes=3, seed=3)
    loss = FastAPLoss(6)(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    grads = torch.autograd.grad(loss, (emb, ref))
    e2, r2 = emb.detach().clone().requires_grad_(True), ref.detach().clone().requires_grad_(True)
    want, _ = fastap_reference(e2, labels.tolist(), 6, ref_emb=r2, ref_labels=ref_labels.tolist())
    want_grads = torch.autograd.grad(want, (e2, r2))
    torch.testing.assert_close(loss, want)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp)


def test_indices_tuple_restricts_each_list_to_mined_pairs():
    emb, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=3, seed=5)
    miner = MultiSimilarityMiner(epsilon=0.3)
    pairs = miner(emb, labels)
    loss = FastAPLoss(8)(emb, labels, indices_tuple=pairs)
    a1, p, a2, n = (t.tolist() for t in pairs)
    want, _ = fastap_reference(emb, labels.tolist(), 8, pairs=(list(zip(a1, p)), list(zip(a2, n))))
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_chunked_equals_unchunked(chunk_size):
    emb, labels = make_embeddings_and_labels(n=24, dim=6, num_classes=4, seed=6)
    full = FastAPLoss(10)(emb, labels)
    chunked = FastAPLoss(10, chunk_size=chunk_size)(emb, labels)
    g1, g2 = (torch.autograd.grad(x, emb)[0] for x in (full, chunked))
    torch.testing.assert_close(full, chunked, rtol=0, atol=1e-12)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)


def test_perfectly_separated_classes_give_zero_loss():
    centres = torch.eye(4, dtype=torch.float64)
    emb = centres.repeat_interleave(3, dim=0) + 0.01 * torch.randn(12, 4, dtype=torch.float64)
    labels = torch.arange(4).repeat_interleave(3)
    assert FastAPLoss(10)(emb, labels).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n, num_classes", [(6, 1), (1, 1)])
def test_one_class_or_single_item_gives_zero_loss_and_counts_skips(n, num_classes):
    emb = torch.randn(n, 4, requires_grad=True)
    loss_fn = FastAPLoss(collect_stats=True)
    loss = loss_fn(emb, torch.zeros(n, dtype=torch.long))
    assert loss.item() == 0 and torch.isfinite(loss)
    assert loss_fn.num_skipped_queries == n and loss_fn.num_valid_queries == 0


def test_queries_without_positives_are_skipped_and_counted():
    emb, _ = make_embeddings_and_labels(n=8, dim=4, num_classes=2)
    labels = torch.tensor([0, 0, 1, 1, 2, 3, 4, 5])  # four singletons
    loss_fn = FastAPLoss(collect_stats=True)
    loss = loss_fn(emb, labels)
    assert loss_fn.num_skipped_queries == 4 and loss_fn.num_valid_queries == 4
    want, aps = fastap_reference(emb, labels.tolist(), 10)
    assert aps[4:] == [None] * 4
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(half):
    emb, labels = make_embeddings_and_labels(n=32, dim=8, dtype=torch.float32)
    loss = FastAPLoss()(emb.detach().to(half).requires_grad_(True), labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss, FastAPLoss()(emb.to(half).float(), labels))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_embeddings_raise(bad):
    emb, labels = make_embeddings_and_labels()
    emb = emb.detach().clone()
    emb[3, 1] = bad
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        FastAPLoss()(emb, labels)


def test_length_mismatch_raises():
    emb, labels = make_embeddings_and_labels()
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        FastAPLoss()(emb, labels[:-1])


@pytest.mark.parametrize("num_bins", [0, -3, 2.5, True])
def test_bad_num_bins_raise(num_bins):
    with pytest.raises(ValueError, match="num_bins"):
        FastAPLoss(num_bins)


@pytest.mark.parametrize(
    "distance",
    [LpDistance(power=1), LpDistance(normalize_embeddings=False, power=2), CosineSimilarity()],
)
def test_wrong_distance_raises(distance):
    with pytest.raises(ValueError, match="LpDistance\\(p=2, power=2"):
        FastAPLoss(distance=distance)


def test_works_with_pml_reducer_and_recordables():
    from pytorch_metric_learning.reducers import SumReducer

    emb, labels = make_embeddings_and_labels(n=16, num_classes=4)
    mean = FastAPLoss()(emb, labels)
    total = FastAPLoss(reducer=SumReducer())(emb, labels)
    torch.testing.assert_close(total, mean * 16)
    assert "num_bins" in FastAPLoss()._record_these
