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


def test_one_class_batch_has_ap_one_per_query_zero_loss_and_zero_gradient():
    # Every query has positives and no negative: AP 1 by the paper's definition (eq. 14 with
    # H_l = H+_l), so each query is valid with loss 0 -- as PML's FastAPLoss scores them.
    emb = torch.randn(6, 4, requires_grad=True)
    labels = torch.zeros(6, dtype=torch.long)
    loss_fn = FastAPLoss(collect_stats=True)
    loss = loss_fn(emb, labels)
    loss.backward()
    assert loss.item() == 0 and torch.equal(emb.grad, torch.zeros(6, 4))
    assert loss_fn.num_valid_queries == 6 and loss_fn.num_skipped_queries == 0
    assert PMLFastAPLoss()(emb, labels).item() == pytest.approx(0, abs=1e-6)  # its round-off


def test_single_item_has_no_positive_and_is_skipped():
    emb = torch.randn(1, 4, requires_grad=True)
    loss_fn = FastAPLoss(collect_stats=True)
    loss = loss_fn(emb, torch.zeros(1, dtype=torch.long))
    assert loss.item() == 0 and torch.isfinite(loss)
    assert loss_fn.num_skipped_queries == 1 and loss_fn.num_valid_queries == 0


def positive_pairs(labels):
    """PML's (a1, p, a2, n) with every same-label pair (no self pair) and no negative pair."""
    same = labels[:, None] == labels[None, :]
    same.fill_diagonal_(False)
    a1, p = torch.nonzero(same, as_tuple=True)
    empty = torch.zeros(0, dtype=torch.long)
    return a1, p, empty, empty.clone()


def test_a_miner_that_mines_no_negative_leaves_lists_of_positives_with_ap_one():
    # The case: a miner that mines no negative. Each query's list (its mined pairs) holds
    # positives only, whose AP is 1 (every prefix is all positives): loss 0, every query with a
    # mined positive valid, zero gradient. PML ranks the full batch instead and uses the tuples as
    # per-query weights, so it reports its full lists' loss (0.86 on the issue's batch).
    emb, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=3, seed=5)
    pairs = positive_pairs(labels)
    loss_fn = FastAPLoss(collect_stats=True)
    loss = loss_fn(emb, labels, indices_tuple=pairs)
    (grad,) = torch.autograd.grad(loss, emb)
    assert loss.item() == 0 and torch.equal(grad, torch.zeros_like(emb))
    assert loss_fn.num_valid_queries == 16 and loss_fn.num_skipped_queries == 0
    assert PMLFastAPLoss()(emb, labels, indices_tuple=pairs).item() > 0.5


def test_queries_left_without_negatives_count_as_ap_one_in_the_mean():
    # Mixed: queries 0-7 keep their mined negatives, queries 8-15 get none. The mean runs over
    # all 16 valid queries, the last 8 with AP 1 (loop reference: eq. 14 on each mined list).
    emb, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=3, seed=7)
    a1, p, _, _ = positive_pairs(labels)
    a2, n = torch.nonzero(labels[:, None] != labels[None, :], as_tuple=True)
    keep = a2 < 8
    a2, n = a2[keep], n[keep]
    loss_fn = FastAPLoss(6, collect_stats=True)
    loss = loss_fn(emb, labels, indices_tuple=(a1, p, a2, n))
    (grad,) = torch.autograd.grad(loss, emb)
    _, aps = fastap_reference(
        emb,
        labels.tolist(),
        6,
        pairs=(list(zip(a1.tolist(), p.tolist())), list(zip(a2.tolist(), n.tolist()))),
    )
    assert all(ap is not None for ap in aps[:8]) and aps[8:] == [None] * 8  # reference: no AP
    want = sum(1 - ap for ap in aps[:8]) / 16  # the other 8: 1 - AP = 0
    (want_grad,) = torch.autograd.grad(want, emb)
    assert loss_fn.num_valid_queries == 16 and loss_fn.num_skipped_queries == 0
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, want_grad)
    assert grad[8:].abs().sum() > 0  # still moved, as items in the lists of queries 0-7


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
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(half):
    emb, labels = make_embeddings_and_labels(n=32, dim=8, dtype=torch.float32)
    x = emb.detach().to(half).requires_grad_(True)
    loss = FastAPLoss()(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    assert loss.dtype == half and grad.dtype == half  # PML's convention: the input's dtype
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # Computed in float32 on the rounded embeddings, then rounded once.
    x32 = x.detach().float().requires_grad_(True)
    loss32 = FastAPLoss()(x32, labels)
    (grad32,) = torch.autograd.grad(loss32, x32)
    assert torch.equal(loss, loss32.to(half))
    torch.testing.assert_close(grad.float(), grad32.to(half).float(), rtol=0, atol=0)


def test_pml_float16_fastap_check_passes():
    # PML's own FastAP test, for float16: 180 unit vectors at angles 0..179 degrees, 10 random
    # classes, num_bins 5; the loss must be torch.isclose (same dtype required) to the authors'
    # formula in float16 with rtol 1e-2. PML's FastAPLoss, computed in float16, is that formula.
    angles = torch.deg2rad(torch.arange(180, dtype=torch.float64))
    emb = torch.stack([torch.cos(angles), torch.sin(angles)], 1).half().requires_grad_(True)
    labels = torch.randint(0, 10, (180,), generator=torch.Generator().manual_seed(0))
    loss = FastAPLoss(5)(emb, labels)
    loss.backward()
    original = PMLFastAPLoss(5)(torch.nn.functional.normalize(emb.detach()), labels)
    assert loss.dtype == original.dtype == torch.float16
    assert torch.isclose(loss, original, rtol=1e-2)
    assert torch.isfinite(emb.grad).all()
    # and within float16 rounding of the float64 loop reference
    want, _ = fastap_reference(emb.detach().double(), labels.tolist(), 5)
    torch.testing.assert_close(loss.double(), want, rtol=1e-3, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_embeddings_raise(bad):
    emb, labels = make_embeddings_and_labels()
    emb = emb.detach().clone()
    emb[3, 1] = bad
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):  # opt-in on gpu
        FastAPLoss(check_values=True)(emb, labels)


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
