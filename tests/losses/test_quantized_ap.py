import pytest
import torch
from pytorch_metric_learning.distances import DotProductSimilarity, LpDistance
from torch.autograd import gradcheck

from pml_rank_plugins.losses import QuantizedAPLoss

from ..conftest import make_embeddings_and_labels
from ..reference_histogram_ap import quantized_ap_reference

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}


@pytest.mark.parametrize(
    "num_bins, tie_aware, class_balanced",
    [
        (20, False, False),
        (5, False, False),
        (2, False, False),
        (8, True, False),
        (6, False, True),
        (6, True, True),
    ],
)
def test_value_and_gradient_match_loop_reference(dtype, num_bins, tie_aware, class_balanced):
    emb, _ = make_embeddings_and_labels(n=15, dim=5, num_classes=3, dtype=dtype)
    labels = torch.tensor([0] * 7 + [1] * 5 + [2] * 3)  # unbalanced classes
    loss_fn = QuantizedAPLoss(num_bins, class_balanced=class_balanced, tie_aware=tie_aware)
    loss = loss_fn(emb, labels)
    (grad,) = torch.autograd.grad(loss, emb)
    ref_emb = emb.detach().double().requires_grad_(True)
    want, _ = quantized_ap_reference(ref_emb, labels.tolist(), num_bins, tie_aware, class_balanced)
    (want_grad,) = torch.autograd.grad(want, ref_emb)
    torch.testing.assert_close(loss.double(), want, **TOL[dtype])
    torch.testing.assert_close(grad.double(), want_grad, **TOL[dtype])


def test_class_balancing_changes_the_loss_only_for_unbalanced_batches():
    emb, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=4)  # 4 per class
    torch.testing.assert_close(
        QuantizedAPLoss(class_balanced=True)(emb, labels), QuantizedAPLoss()(emb, labels)
    )
    skewed = torch.tensor([0] * 10 + [1] * 3 + [2] * 3)
    assert not torch.isclose(
        QuantizedAPLoss(class_balanced=True)(emb, skewed), QuantizedAPLoss()(emb, skewed)
    )


@pytest.mark.parametrize("tie_aware", [False, True])
def test_gradcheck_float64(tie_aware):
    emb, labels = make_embeddings_and_labels(n=12, dim=4, num_classes=3, seed=1)
    fn = QuantizedAPLoss(7, tie_aware=tie_aware, class_balanced=True)
    assert gradcheck(lambda e: fn(e, labels), (emb,))


def test_ref_emb_equals_hand_computation():
    emb, labels = make_embeddings_and_labels(n=10, dim=4, num_classes=3, seed=2)
    ref, ref_labels = make_embeddings_and_labels(n=14, dim=4, num_classes=3, seed=3)
    loss = QuantizedAPLoss(9)(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    want, _ = quantized_ap_reference(
        emb, labels.tolist(), 9, ref_emb=ref, ref_labels=ref_labels.tolist()
    )
    torch.testing.assert_close(loss, want)


def test_chunked_equals_unchunked():
    emb, labels = make_embeddings_and_labels(n=20, dim=6, num_classes=4, seed=6)
    full = QuantizedAPLoss(tie_aware=True)(emb, labels)
    chunked = QuantizedAPLoss(tie_aware=True, chunk_size=3)(emb, labels)
    torch.testing.assert_close(full, chunked, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(full, emb)[0], torch.autograd.grad(chunked, emb)[0], rtol=0, atol=1e-12
    )


def test_perfect_ranking_gives_zero_loss():
    emb = torch.eye(3, dtype=torch.float64).repeat_interleave(4, dim=0)
    labels = torch.arange(3).repeat_interleave(4)
    assert QuantizedAPLoss()(emb, labels).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("tie_aware", [False, True])
def test_one_class_batch_has_ap_one_per_query(tie_aware):
    # Positives only: P_m = 1 (eq. 9-11, and eq. 13 for mAP_T), so AP 1 and loss 0 per query,
    # every query valid (counted in the mean), zero gradient.
    emb = torch.randn(5, 3, requires_grad=True)
    loss_fn = QuantizedAPLoss(tie_aware=tie_aware, collect_stats=True)
    loss = loss_fn(emb, torch.zeros(5, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0 and torch.equal(emb.grad, torch.zeros(5, 3))
    assert loss_fn.num_valid_queries == 5 and loss_fn.num_skipped_queries == 0


def test_a_reference_set_of_the_query_class_only_gives_ap_one():
    emb, labels = make_embeddings_and_labels(n=12, dim=4, num_classes=3, seed=2)
    ref = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    loss_fn = QuantizedAPLoss(collect_stats=True)
    loss = loss_fn(emb, labels, ref_emb=ref, ref_labels=torch.ones(5, dtype=torch.long))
    grads = torch.autograd.grad(loss, (emb, ref))
    # class 1 queries: positives only (AP 1, valid); the others: no positive (skipped)
    assert loss.item() == 0 and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert loss_fn.num_valid_queries == int((labels == 1).sum()) == 4
    assert loss_fn.num_skipped_queries == 8


@pytest.mark.parametrize("class_balanced", [False, True])
def test_queries_left_without_negatives_count_as_ap_one_in_the_mean(class_balanced):
    # Queries 0-7 keep every pair (their lists are the full lists), queries 8-15 get no
    # negative: AP 1, loss 0, in the mean and in the class weights of all 16 valid queries.
    emb, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=3, seed=7)
    same = labels[:, None] == labels[None, :]
    same.fill_diagonal_(False)
    a1, p = torch.nonzero(same, as_tuple=True)
    a2, n = torch.nonzero(~(labels[:, None] == labels[None, :]), as_tuple=True)
    a2, n = a2[a2 < 8], n[a2 < 8]
    loss_fn = QuantizedAPLoss(class_balanced=class_balanced, collect_stats=True)
    loss = loss_fn(emb, labels, indices_tuple=(a1, p, a2, n))
    _, aps = quantized_ap_reference(emb, labels.tolist(), 20)  # full lists, no weights
    counts = torch.bincount(labels).double()
    weights = 16 / (len(counts) * counts[labels]) if class_balanced else torch.ones(16)
    want = sum(weights[i] * (1 - aps[i]) for i in range(8)) / 16
    assert loss_fn.num_valid_queries == 16 and loss_fn.num_skipped_queries == 0
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(half):
    emb, labels = make_embeddings_and_labels(n=32, dim=8, dtype=torch.float32)
    x = emb.detach().to(half).requires_grad_(True)
    loss = QuantizedAPLoss(tie_aware=True)(x, labels)
    loss.backward()
    assert loss.dtype == half and torch.isfinite(loss) and torch.isfinite(x.grad).all()
    exact = QuantizedAPLoss(tie_aware=True)(x.detach().float(), labels)
    assert torch.equal(loss, exact.to(half))


@pytest.mark.parametrize("num_bins", [1, 0, 3.0])
def test_bad_num_bins(num_bins):
    with pytest.raises(ValueError, match=r"num_bins must be an integer in \[2, 4096\]"):
        QuantizedAPLoss(num_bins)


@pytest.mark.parametrize("distance", [LpDistance(), DotProductSimilarity()])
def test_wrong_distance(distance):
    with pytest.raises(ValueError, match="CosineSimilarity"):
        QuantizedAPLoss(distance=distance)


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        QuantizedAPLoss(chunk_size=0)


def test_nan_raises():
    emb, labels = make_embeddings_and_labels()
    with pytest.raises(ValueError, match="non-finite"):  # opt-in on gpu (auto on CUDA)
        QuantizedAPLoss(check_values=True)(emb.detach() * float("nan"), labels)


def test_single_item_gives_zero_loss_and_counts_skip():
    loss_fn = QuantizedAPLoss(collect_stats=True, class_balanced=True)
    loss = loss_fn(torch.randn(1, 3, requires_grad=True), torch.zeros(1, dtype=torch.long))
    assert loss.item() == 0 and torch.isfinite(loss)
    assert loss_fn.num_skipped_queries == 1 and loss_fn.num_valid_queries == 0


def test_length_mismatch_raises():
    emb, labels = make_embeddings_and_labels()
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        QuantizedAPLoss()(emb, labels[:-1])


def test_ref_length_mismatch_raises():
    emb, labels = make_embeddings_and_labels(n=8)
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        QuantizedAPLoss()(emb, labels, ref_emb=emb[:5], ref_labels=labels[:4])


def test_bfloat16_is_computed_in_float32():
    emb, labels = make_embeddings_and_labels(n=32, dim=8, dtype=torch.float32)
    loss = QuantizedAPLoss()(emb.detach().to(torch.bfloat16).requires_grad_(True), labels)
    assert loss.dtype == torch.bfloat16
    exact = QuantizedAPLoss()(emb.to(torch.bfloat16).float(), labels)
    assert torch.equal(loss, exact.to(torch.bfloat16))
