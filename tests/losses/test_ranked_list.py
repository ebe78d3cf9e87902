import math
import warnings

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.losses import RankedListLoss as PMLRankedListLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner
from pytorch_metric_learning.reducers import AvgNonZeroReducer, BaseReducer

from pml_rank_plugins.losses import RankedListLoss
from tests.conftest import TEST_DEVICE, make_embeddings_and_labels
from tests.reference_ranked_list import reference_caffe_v12_gradient, reference_rll


class PerQuery(BaseReducer):
    """Test reducer: hands back the per-query element losses unreduced."""

    def element_reduction(self, losses, *_):
        return losses


class FixedDistance(LpDistance):
    """Test distance: returns a given matrix, so gradients w.r.t. distances can be read off."""

    def __init__(self, mat):
        super().__init__()
        self.mat = mat

    def compute_mat(self, query_emb, ref_emb):
        return self.mat


def pml_loss(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PML warns for any temperature > 5
        return PMLRankedListLoss(**kwargs)


def tolerances(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)


def embeddings(n=12, dim=4, num_classes=3, seed=0, dtype=torch.float64):
    return make_embeddings_and_labels(n=n, dim=dim, num_classes=num_classes, dtype=dtype, seed=seed)


@pytest.mark.parametrize("gallery_gradient", [False, True])
@pytest.mark.parametrize("Tn,Tp,lam", [(10.0, 0.0, 1.0), (0.0, 0.0, 1.0), (25.0, 3.0, 0.5)])
def test_matches_loop_reference_values_and_gradients(dtype, gallery_gradient, Tn, Tp, lam):
    x, labels = embeddings(dtype=dtype)
    loss_fn = RankedListLoss(Tn=Tn, Tp=Tp, lam=lam, gallery_gradient=gallery_gradient)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)

    x64 = x.detach().double().requires_grad_()
    kw = dict(Tn=Tn, Tp=Tp, lam=lam, gallery_gradient=gallery_gradient)
    ref = torch.stack(reference_rll(x64, labels, **kw)).mean()
    (ref_grad,) = torch.autograd.grad(ref, x64)
    torch.testing.assert_close(loss.double(), ref.detach(), **tolerances(dtype))
    torch.testing.assert_close(grad.double(), ref_grad, **tolerances(dtype))


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_ref_emb_matches_loop_reference(gallery_gradient):
    x, labels = embeddings(n=8, seed=1)
    r, ref_labels = embeddings(n=9, seed=2)
    loss = RankedListLoss(gallery_gradient=gallery_gradient)(
        x, labels, ref_emb=r, ref_labels=ref_labels
    )
    gx, gr = torch.autograd.grad(loss, (x, r), allow_unused=True)
    x2, r2 = x.detach().clone().requires_grad_(), r.detach().clone().requires_grad_()
    ref = torch.stack(
        reference_rll(x2, labels, r2, ref_labels, gallery_gradient=gallery_gradient)
    ).mean()
    rgx, rgr = torch.autograd.grad(ref, (x2, r2), allow_unused=True)
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(gx, rgx)
    if gallery_gradient:
        torch.testing.assert_close(gr, rgr)
        assert gr.abs().sum() > 0
    else:
        assert gr is None and rgr is None


def test_gradient_modes_differ_and_default_updates_only_queries():
    # gallery_gradient=False: the batch gradient is the sum over queries of each query's own
    # gradient, i.e. the gradient w.r.t. the query side of a (queries, constant gallery) problem.
    x, labels = embeddings(n=10, seed=3)
    g_default = torch.autograd.grad(RankedListLoss()(x, labels), x)[0]
    g_both = torch.autograd.grad(RankedListLoss(gallery_gradient=True)(x, labels), x)[0]
    gallery = x.detach().clone()
    g_query_side = torch.autograd.grad(
        RankedListLoss(gallery_gradient=True)(x, labels, ref_emb=gallery, ref_labels=labels), x
    )[0]
    torch.testing.assert_close(g_default, g_query_side)
    assert not torch.allclose(g_default, g_both)


def test_gradcheck_float64_both_modes():
    # Tn = Tp = 0: uniform weights, so the constant-weight gradient is the true gradient.
    x, labels = embeddings(n=8, dim=3, seed=4)
    x = x.detach().requires_grad_()
    both = RankedListLoss(Tn=0.0, gallery_gradient=True)
    assert torch.autograd.gradcheck(lambda e: both(e, labels), (x,))
    # gallery_gradient=False is the gradient w.r.t. the queries with the gallery held constant
    # (the self pair has d = 0 < alpha - m, so it is never mined and needs no masking).
    gallery = x.detach().clone()
    assert torch.autograd.gradcheck(
        lambda e: both(e, labels, ref_emb=gallery, ref_labels=labels), (x,)
    )
    # ... and with Tn > 0 too, once the weights are frozen by feeding them from the miner.
    from pml_rank_plugins.miners import RankedListMiner

    pairs = RankedListMiner(Tn=10.0)(x, labels, gallery, labels)
    assert len(pairs[2]) > 0
    loss = RankedListLoss(Tn=10.0)
    assert torch.autograd.gradcheck(lambda e: loss(e, labels, pairs, gallery, labels), (x,))


def test_element_losses_cover_every_query_and_are_never_nan():
    # Class 0 is satisfied (identical embeddings, far from everything); class 1 and 2 are not.
    x = torch.tensor(
        [[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0.6, 0.8], [0, 0.8, 0.6], [0, 0.9, 0.1]],
        dtype=torch.float64,
        requires_grad=True,
    )
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss_fn = RankedListLoss(reducer=PerQuery(), collect_stats=True)
    per_query = loss_fn(x, labels)
    assert per_query.shape == (6,)
    assert per_query[:2].tolist() == [0.0, 0.0] and (per_query[2:] > 0).all()
    assert loss_fn.num_queries_nothing_mined == 2
    ref = torch.stack(reference_rll(x, labels))
    torch.testing.assert_close(per_query, ref)
    # eq. 14: default MeanReducer averages over all queries; AvgNonZeroReducer over mined ones
    torch.testing.assert_close(RankedListLoss()(x, labels), ref.mean())
    nonzero = RankedListLoss(reducer=AvgNonZeroReducer())(x, labels)
    torch.testing.assert_close(nonzero, ref[2:].mean())


def test_nothing_mined_gives_zero_loss_and_is_counted():
    x = torch.eye(4, dtype=torch.float64).repeat_interleave(2, 0).requires_grad_()
    labels = torch.arange(4).repeat_interleave(2)  # same class identical, classes sqrt(2) apart
    loss_fn = RankedListLoss(collect_stats=True)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert loss_fn.num_queries_nothing_mined == 8
    assert loss_fn.num_pos_pairs == 0 and loss_fn.num_neg_pairs == 0


def test_collect_stats_counts_mined_pairs():
    x, labels = embeddings(n=12, seed=5)
    loss_fn = RankedListLoss(collect_stats=True)
    loss_fn(x, labels)
    xn = torch.nn.functional.normalize(x.detach(), dim=1)
    d = torch.cdist(xn, xn)
    same = labels[:, None] == labels[None]
    eye = torch.eye(12, dtype=torch.bool, device=labels.device)
    n_pos = (same & ~eye & (d > 0.8)).sum(1)
    n_neg = (~same & (d < 1.2)).sum(1)
    # int()/float(): the gpu backend (auto on CUDA) keeps the stats as device tensors
    assert int(loss_fn.num_pos_pairs) == n_pos.sum().item()
    assert int(loss_fn.num_neg_pairs) == n_neg.sum().item()
    assert float(loss_fn.avg_pos_per_query) == pytest.approx(n_pos.double().mean().item())
    assert float(loss_fn.avg_neg_per_query) == pytest.approx(n_neg.double().mean().item())
    nothing = ((n_pos == 0) & (n_neg == 0)).sum().item()
    assert int(loss_fn.num_queries_nothing_mined) == nothing


def test_indices_tuple_from_a_pml_miner_restricts_the_lists():
    x, labels = embeddings(n=12, seed=6)
    pairs = MultiSimilarityMiner(epsilon=0.05)(x, labels)
    assert len(pairs[0]) > 0 and len(pairs[2]) > 0
    loss = RankedListLoss()(x, labels, pairs)
    allowed_pos = set(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
    allowed_neg = set(zip(pairs[2].tolist(), pairs[3].tolist(), strict=True))
    ref = torch.stack(reference_rll(x, labels, allowed_pos=allowed_pos, allowed_neg=allowed_neg))
    torch.testing.assert_close(loss, ref.mean())
    g, rg = (torch.autograd.grad(v, x)[0] for v in (loss, ref.mean()))
    torch.testing.assert_close(g, rg)


def test_triplet_indices_tuple_is_accepted():
    x, labels = embeddings(n=6, seed=7)
    a = torch.tensor([0, 0])
    p = torch.tensor([int((labels == labels[0]).nonzero()[1])] * 2)  # one positive, twice
    n = (labels != labels[0]).nonzero()[:2, 0]
    loss = RankedListLoss(Tn=0.0)(x, labels, (a, p, n))
    ref = reference_rll(
        x, labels, Tn=0.0, allowed_pos={(0, p[0].item())}, allowed_neg={(0, j) for j in n.tolist()}
    )
    torch.testing.assert_close(loss, torch.stack(ref).mean())


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_embeddings_large_temperature_finite(half):
    x, labels = make_embeddings_and_labels(n=32, dim=8, dtype=half, seed=8)
    loss = RankedListLoss(Tn=50.0, Tp=50.0, gallery_gradient=True)(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and grad.dtype == half
    assert loss.dtype == half and loss.item() > 0  # the embeddings' dtype, as PML returns it
    # computed in float32: the float32 value of float32 inputs holding the same numbers, rounded
    x32 = x.detach().float()
    ref = RankedListLoss(Tn=50.0, Tp=50.0, gallery_gradient=True)(x32, labels)
    assert ref.dtype == torch.float32
    assert torch.equal(loss, ref.to(half))
    if half == torch.float16:
        # PML's version overflows here: exp(50 * (alpha - d)) exceeds float16's range.
        assert not torch.isfinite(pml_loss(margin=0.4, Tn=50.0, alpha=1.2)(x, labels))


def _pml_eps_factors(x, labels, alpha=1.2, margin=0.4, eps=1e-5):
    """PML divides by sum(w) + N * 1e-5 (its epsilon is added once per row element).

    At T = 0 every weight is 1, so PML's L_P and L_N of query i are ours times n / (n + N eps),
    n = number of mined positives / negatives (counted here from the distances directly).
    """
    xn = torch.nn.functional.normalize(x.detach(), dim=1)
    d = torch.cdist(xn, xn)
    same = labels[:, None] == labels[None]
    eye = torch.eye(len(x), dtype=torch.bool, device=labels.device)
    n_pos = (same & ~eye & (d > alpha - margin)).sum(1).double()
    n_neg = (~same & (d < alpha)).sum(1).double()
    n = len(x)
    return n_pos / (n_pos + n * eps), n_neg / (n_neg + n * eps)


@pytest.mark.parametrize("imbalance", [0.5, 0.25])
def test_agrees_with_pml_at_zero_temperature_with_gallery_gradient(imbalance):
    # PML: (1 - imbalance) L_P + imbalance L_N, mean over queries, gradient through both ends of
    # every pair. Ours with gallery_gradient=True, Tn = 0, lam = imbalance / (1 - imbalance),
    # times (1 - imbalance) -- exactly, once PML's epsilon is accounted for.
    x, labels = embeddings(n=16, dim=5, num_classes=4, seed=9)
    pml = pml_loss(margin=0.4, Tn=0.0, Tp=0.0, imbalance=imbalance, alpha=1.2)(x, labels)
    g_pml = torch.autograd.grad(pml, x)[0]

    ours = RankedListLoss(Tn=0.0, lam=imbalance / (1 - imbalance), gallery_gradient=True)
    loss = ours(x, labels) * (1 - imbalance)
    # Up to PML's epsilon (relative N * 1e-5 / n_mined) they agree directly ...
    torch.testing.assert_close(loss, pml, rtol=2e-3, atol=0)
    # ... and exactly once it is modelled: per query L_P = L(lam=0), L_N = L(lam=1) - L(lam=0).
    lp = RankedListLoss(Tn=0.0, lam=0.0, gallery_gradient=True, reducer=PerQuery())(x, labels)
    l1 = RankedListLoss(Tn=0.0, lam=1.0, gallery_gradient=True, reducer=PerQuery())(x, labels)
    c_pos, c_neg = _pml_eps_factors(x, labels)
    expected = ((1 - imbalance) * c_pos * lp + imbalance * c_neg * (l1 - lp)).mean()
    torch.testing.assert_close(expected, pml, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.autograd.grad(expected, x)[0], g_pml, rtol=1e-10, atol=1e-12)


def test_differs_from_pml_in_default_gradient_mode():
    # Same values as above, but by default (gallery_gradient=False) gallery items get no gradient
    # from other queries' lists, so the gradient differs from PML's even at T = 0.
    x, labels = embeddings(n=16, dim=5, num_classes=4, seed=9)
    pml = pml_loss(margin=0.4, Tn=0.0, imbalance=0.5, alpha=1.2)(x, labels)
    ours = 0.5 * RankedListLoss(Tn=0.0)(x, labels)
    torch.testing.assert_close(ours, pml, rtol=2e-3, atol=0)
    g_pml = torch.autograd.grad(pml, x)[0]
    g_ours = torch.autograd.grad(ours, x)[0]
    assert (g_pml - g_ours).abs().max() > 1e-3


def test_gradient_sign_every_negative_pushed_away_unlike_pml():
    # Query 0 has negatives at distances 0.5, 0.9, 1.15; alpha 1.2, T 10. A fixed distance matrix
    # lets us read dL/dd for query 0's list directly (other rows are far apart, nothing mined).
    d = torch.full((4, 4), 1.9, dtype=torch.float64)
    d.fill_diagonal_(0.0)
    d[0, 1:] = torch.tensor([0.5, 0.9, 1.15], dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3])
    x = torch.randn(4, 3, dtype=torch.float64)

    mat = d.clone().requires_grad_()
    ours = RankedListLoss(Tn=10.0, distance=FixedDistance(mat))(x, labels)
    (g_ours,) = torch.autograd.grad(ours, mat)
    assert (g_ours[0, 1:] < 0).all(), g_ours[0]  # descent increases every distance

    mat = d.clone().requires_grad_()
    pml = pml_loss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2, distance=FixedDistance(mat))
    (g_pml,) = torch.autograd.grad(pml(x, labels), mat)
    assert g_pml[0, 1] < 0  # the hardest negative is pushed away ...
    assert g_pml[0, 2] > 0 and g_pml[0, 3] > 0  # ... the two easier ones are pulled closer
    # PML differentiates through the softmax: dL_N/dd_k = -p_k (1 + T (a_k - L_N)), a = alpha - d
    a = 1.2 - d[0, 1:]
    p = torch.softmax(10.0 * a, 0)
    expected = -p * (1 + 10.0 * (a - (p * a).sum())) * 0.5 / 4  # imbalance 0.5, mean over 4
    torch.testing.assert_close(g_pml[0, 1:], expected, rtol=1e-3, atol=0)  # up to PML's epsilon


def test_embedding_gradient_pushes_negatives_away():
    # Same three negatives as embeddings on the unit circle; with gallery_gradient=True a descent
    # step moves every negative away from the query and the query away from each negative.
    angles = [2 * math.asin(dist / 2) for dist in (0.5, 0.9, 1.15)]
    x = torch.tensor(
        [[1.0, 0.0]] + [[math.cos(t), math.sin(t)] for t in angles], dtype=torch.float64
    )
    x.requires_grad_()
    labels = torch.tensor([0, 1, 2, 3])
    loss_fn = RankedListLoss(Tn=10.0, gallery_gradient=True, reducer=PerQuery())
    (grad,) = torch.autograd.grad(loss_fn(x, labels)[0], x)  # query 0's list only
    for k in (1, 2, 3):
        assert torch.dot(-grad[k], x[k].detach() - x[0].detach()) > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(alpha=0.4, margin=0.4), "alpha must be larger than margin"),
        (dict(Tn=-1.0), "Tn must be >= 0"),
        (dict(Tp=-0.5), "Tp must be >= 0"),
        (dict(lam=-1.0), "lam must be >= 0"),
        (dict(distance=CosineSimilarity()), "not a similarity"),
    ],
)
def test_bad_parameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RankedListLoss(**kwargs)


def test_bad_inputs_raise():
    x, labels = embeddings(n=8, seed=10)
    # Finiteness is a value check: opt-in on the gpu backend (auto on CUDA), so asked for here.
    loss_fn = RankedListLoss(check_values=True)
    bad = x.detach().clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        loss_fn(bad, labels)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="ref_emb contains 1 non-finite"):
        loss_fn(x, labels, ref_emb=bad, ref_labels=labels)
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        loss_fn(x, labels[:-1])
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        loss_fn(x, labels, ref_emb=x.detach(), ref_labels=labels[:-2])
    with pytest.raises(ValueError, match="labels are required"):
        loss_fn(x, None)
    with pytest.raises(ValueError, match="ref_labels are required"):
        loss_fn(x, labels, ref_emb=x.detach())


@pytest.mark.parametrize("kwargs", [dict(Tn=1e39), dict(Tp=3.5e38), dict(Tn=1e39, Tp=1e39)])
def test_temperature_beyond_float32_range_is_finite(kwargs):
    # Used to give NaN (T rounded to inf in float32, 0 * inf); now the T -> inf limit.
    x, labels = embeddings(n=16, seed=20, dtype=torch.float32)
    loss = RankedListLoss(**kwargs)(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    limit = RankedListLoss(**{k: 1e30 for k in kwargs})(x, labels)
    torch.testing.assert_close(loss, limit)


@pytest.mark.parametrize("name", ["lam", "alpha"])
def test_overflowing_lam_or_alpha_raise_naming_it(name):
    # Used to return inf silently.
    x, labels = embeddings(n=16, seed=21, dtype=torch.float32)
    with pytest.raises(ValueError, match=f"{name}=1e\\+39 exceeds the largest torch.float32"):
        RankedListLoss(**{name: 1e39})(x, labels)


@pytest.mark.parametrize("Tn,Tp", [(0.0, 0.0), (10.0, 0.0), (10.0, 2.0)])
def test_empty_batch_gives_zero_loss_connected_to_the_graph(Tn, Tp):
    # Used to give NaN (Tn = Tp = 0) or IndexError from amin().
    x = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.zeros(0, dtype=torch.long)
    loss_fn = RankedListLoss(Tn=Tn, Tp=Tp, collect_stats=True)
    loss = loss_fn(x, labels)
    assert loss.item() == 0.0 and loss.requires_grad
    (grad,) = torch.autograd.grad(loss, x)
    assert grad.shape == (0, 4)
    assert loss_fn.num_valid_queries == 0 and loss_fn.num_skipped_queries == 0


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_empty_ref_emb_gives_zero_loss_and_counts_every_query_skipped(gallery_gradient):
    x, labels = embeddings(n=8, seed=22)
    ref = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    loss_fn = RankedListLoss(gallery_gradient=gallery_gradient, collect_stats=True)
    loss = loss_fn(x, labels, ref_emb=ref, ref_labels=torch.zeros(0, dtype=torch.long))
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, x)
    assert (grad == 0).all()
    assert loss_fn.num_valid_queries == 0 and loss_fn.num_skipped_queries == 8
    assert loss_fn.num_pos_pairs == 0 and loss_fn.num_queries_nothing_mined == 8


def test_valid_and_skipped_query_stats_on_a_normal_batch():
    x, labels = embeddings(n=12, seed=23)
    loss_fn = RankedListLoss(collect_stats=True)
    loss_fn(x, labels)
    assert loss_fn.num_valid_queries == 12 and loss_fn.num_skipped_queries == 0


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_autocast_bfloat16_finite_and_close_to_float32(gallery_gradient):
    # Used to fail with "mat1 and mat2 must have the same dtype" (functional/euclidean.py).
    gen = torch.Generator().manual_seed(24)
    model = torch.nn.Linear(16, 8).float()
    inputs = torch.randn(48, 16, generator=gen)
    labels = torch.arange(48) % 6
    loss_fn = RankedListLoss(gallery_gradient=gallery_gradient)
    with torch.autocast(TEST_DEVICE.type, dtype=torch.bfloat16):
        emb = model(inputs)
        assert emb.dtype == torch.bfloat16
        loss = loss_fn(emb, labels)
    assert loss.dtype == torch.float32  # float32 under autocast, as PML's losses (issue 41)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    ref = loss_fn(model(inputs), labels)
    assert ref.dtype == torch.float32
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    # bfloat16 embeddings carry ~3 significant digits; the loss is computed in float32 from them.
    torch.testing.assert_close(loss.float(), ref, rtol=2e-2, atol=1e-2)
    for g, rg in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, rg, rtol=0.1, atol=2e-2)


@pytest.mark.parametrize(
    "indices_tuple, message",
    [
        (
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([-1])),
            r"indices_tuple\[3\] \(negatives\) has negative index -1",
        ),
        (
            (torch.tensor([-2]), torch.tensor([1]), torch.tensor([0]), torch.tensor([3])),
            r"indices_tuple\[0\] \(positive anchors\) has negative index -2",
        ),
        (
            (torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), torch.tensor([40])),
            r"indices_tuple\[3\] \(negatives\) has index 40 >= 8 reference rows",
        ),
        (
            (torch.tensor([0]), torch.tensor([2]), torch.tensor([9])),
            r"indices_tuple\[2\] \(negatives\) has index 9 >= 8 reference rows",
        ),
    ],
)
def test_bad_indices_tuple_raises_naming_the_element(indices_tuple, message):
    # A negative index used to wrap around silently (the last row taken as the pair's partner).
    # Index ranges are value checks, opt-in on the gpu backend (auto on CUDA: without them an
    # out-of-range index is a device-side assert that poisons the process's CUDA context).
    x, labels = embeddings(n=8, seed=25)
    indices_tuple = tuple(t.to(x.device) for t in indices_tuple)
    with pytest.raises(ValueError, match=message):
        RankedListLoss(check_values=True)(x, labels, indices_tuple)


def test_bad_indices_with_miner_weights_raise_before_indexing():
    x, labels = embeddings(n=8, seed=26)
    from pml_rank_plugins.miners import WeightedPairs

    i = torch.tensor([0])
    bad = WeightedPairs(i, torch.tensor([1]), i, torch.tensor([-3]), weights=torch.ones(1))
    with pytest.raises(ValueError, match=r"indices_tuple\[3\] \(negatives\) has negative"):
        RankedListLoss(check_values=True)(x, labels, bad)  # opt-in on gpu (see above)
    bad = WeightedPairs(i, torch.tensor([1]), torch.tensor([8]), i, weights=torch.ones(1))
    with pytest.raises(ValueError, match=r"indices_tuple\[2\] \(negative anchors\) has index 8"):
        RankedListLoss(check_values=True)(x, labels, bad)


class DenseLp(LpDistance):
    """An LpDistance subclass: RankedListLoss computes it as a dense (N, M) matrix (the generic
    path for any distance object), so it checks the chunked Euclidean path against it."""


@pytest.mark.parametrize("gallery_gradient", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 5, None])
@pytest.mark.parametrize("mode", ["labels", "ref_emb", "miner_weights", "pml_miner"])
@pytest.mark.parametrize("query_weighting", ["mean", "weight_share"])
def test_chunked_path_equals_dense_path(gallery_gradient, chunk_size, mode, query_weighting):
    from pml_rank_plugins.miners import RankedListMiner

    x, labels = embeddings(n=20, dim=3, num_classes=4, seed=30)
    kwargs = dict(
        Tn=10.0, Tp=2.0, lam=0.7, gallery_gradient=gallery_gradient, query_weighting=query_weighting
    )
    args, ref = (x, labels), None
    if mode == "ref_emb":
        ref, ref_labels = embeddings(n=17, dim=3, num_classes=4, seed=31)
        args = (x, labels, None, ref, ref_labels)
    elif mode == "miner_weights":
        args = (x, labels, RankedListMiner(Tn=5.0)(x, labels))
        assert len(args[2].weights) > 0
    elif mode == "pml_miner":
        args = (x, labels, MultiSimilarityMiner(epsilon=0.1)(x, labels))
    chunked = RankedListLoss(chunk_size=chunk_size, reducer=PerQuery(), **kwargs)
    dense = RankedListLoss(
        distance=DenseLp(normalize_embeddings=True), reducer=PerQuery(), **kwargs
    )
    a, b = chunked(*args), dense(*args)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert (a > 0).any()
    inputs = (x,) if ref is None else (x, ref)
    upstream = torch.rand(len(x), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ga = torch.autograd.grad(a, inputs, upstream, allow_unused=True)
    gb = torch.autograd.grad(b, inputs, upstream, allow_unused=True)
    for u, v in zip(ga, gb, strict=True):
        if v is None:
            assert u is None
        else:
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_chunk_size_is_validated():
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="chunk_size"):
            RankedListLoss(chunk_size=bad)


@pytest.mark.parametrize("b", [0.0, 0.3, 1.0])
def test_imbalance_equals_the_loop_reference_and_passes_gradcheck(b):
    # PML's weighting (1 - b) L_P + b L_N, from the paper's per-query terms computed by loops
    x, labels = embeddings(n=8, dim=3, seed=5)
    x = x.detach().requires_grad_()
    loss_fn = RankedListLoss(0.4, 10.0, imbalance=b, alpha=1.2, reducer=PerQuery())
    ours = loss_fn(x, labels)
    lp = reference_rll(x, labels, lam=0.0)  # L_P alone
    full = reference_rll(x, labels, lam=1.0)  # L_P + L_N
    expected = torch.stack([(1 - b) * p + b * (f - p) for p, f in zip(lp, full)])
    assert (expected > 0).any()  # the lists are not empty: the comparison is not vacuous
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-14)
    # Tn = 0: uniform weights, so the constant-weight gradient is the true gradient
    uniform = RankedListLoss(0.4, 0.0, imbalance=b, alpha=1.2, gallery_gradient=True)
    assert torch.autograd.gradcheck(lambda e: uniform(e, labels), (x,))


# query_weighting: the paper's mean (eq. 14) or the authors' Caffe layer's weight share


@pytest.mark.parametrize("gallery_gradient", [False, True])
@pytest.mark.parametrize("Tn,Tp,lam", [(10.0, 0.0, 1.0), (0.0, 0.0, 1.0), (25.0, 3.0, 0.5)])
def test_weight_share_matches_loop_reference_values_and_gradients(
    dtype, gallery_gradient, Tn, Tp, lam
):
    x, labels = embeddings(dtype=dtype)
    kw = dict(Tn=Tn, Tp=Tp, lam=lam, gallery_gradient=gallery_gradient)
    loss_fn = RankedListLoss(query_weighting="weight_share", **kw)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)

    x64 = x.detach().double().requires_grad_()
    ref = torch.stack(reference_rll(x64, labels, query_weighting="weight_share", **kw)).mean()
    (ref_grad,) = torch.autograd.grad(ref, x64)
    torch.testing.assert_close(loss.double(), ref.detach(), **tolerances(dtype))
    torch.testing.assert_close(grad.double(), ref_grad, **tolerances(dtype))
    # not the paper's mean on this batch (the comparison above is not a restatement of it)
    mean = torch.stack(reference_rll(x64, labels, **kw)).mean()
    assert abs(mean.item() - ref.item()) > 1e-3


@pytest.mark.parametrize("margin,Tn,Tp", [(0.4, 10.0, 0.0), (0.4, 12.0, 0.0), (0.2, 10.0, 2.0)])
def test_weight_share_gradient_is_the_caffe_layers_pair_by_pair_gradient(margin, Tn, Tp):
    # The Caffe layer's input is already L2-normalized (a Normalization layer before it), so the
    # loss here takes unit vectors without normalizing again; alpha defaults to 1 + margin / 2,
    # the layer's negative boundary.
    x, labels = embeddings(n=14, dim=3, num_classes=3, seed=40)
    x = torch.nn.functional.normalize(x.detach()).requires_grad_()
    loss_fn = RankedListLoss(
        margin=margin,
        Tn=Tn,
        Tp=Tp,
        query_weighting="weight_share",
        distance=LpDistance(normalize_embeddings=False),
    )
    (grad,) = torch.autograd.grad(loss_fn(x, labels), x)
    expected = reference_caffe_v12_gradient(x, labels, margin, Tn, Tp)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    # ... which the paper's mean is not
    (grad_mean,) = torch.autograd.grad(
        RankedListLoss(
            margin=margin, Tn=Tn, Tp=Tp, distance=LpDistance(normalize_embeddings=False)
        )(x, labels),
        x,
    )
    assert not torch.allclose(grad_mean, expected, rtol=1e-3, atol=1e-5)


def test_weight_share_gradcheck_float64():
    # Tn = Tp = 0: uniform within-query weights and W_i = the number of mined pairs, piecewise
    # constant in the embeddings, so the constant-weight gradient is the true gradient.
    x, labels = embeddings(n=8, dim=3, seed=4)
    x = x.detach().requires_grad_()
    both = RankedListLoss(Tn=0.0, gallery_gradient=True, query_weighting="weight_share")
    assert torch.autograd.gradcheck(lambda e: both(e, labels), (x,))
    gallery = x.detach().clone()  # gallery_gradient=False: the query side, gallery constant
    loss = RankedListLoss(Tn=0.0, query_weighting="weight_share")
    assert torch.autograd.gradcheck(
        lambda e: loss(e, labels, ref_emb=gallery, ref_labels=labels), (x,)
    )
    per_query = RankedListLoss(Tn=0.0, query_weighting="weight_share", reducer=PerQuery())(
        x, labels
    )
    assert len(set(torch.round(per_query, decimals=9).tolist())) > 2  # queries weighted unequally


def test_weight_share_shares_sum_to_half_and_follow_the_weight_sums():
    # Element losses are N c_i L_i: divided by the paper's per-query L_i they give N c_i, which
    # sum to N / 2 and are proportional to W_i, counted here from the distances (Tn = Tp = 0:
    # W_i is the number of mined pairs).
    x, labels = embeddings(n=12, dim=3, seed=41)
    shared = RankedListLoss(Tn=0.0, query_weighting="weight_share", reducer=PerQuery())(x, labels)
    plain = RankedListLoss(Tn=0.0, reducer=PerQuery())(x, labels)
    d = torch.cdist(*(2 * [torch.nn.functional.normalize(x.detach())]))
    same = labels[:, None] == labels[None]
    off_diagonal = ~torch.eye(len(x), dtype=torch.bool)
    counts = ((same & off_diagonal & (d > 0.8)) | (~same & (d < 1.2))).sum(1).double()
    mined = plain > 0
    assert mined.sum() >= 6
    factors = shared[mined] / plain[mined]
    torch.testing.assert_close(factors, len(x) * 0.5 * counts[mined] / counts.sum())
    assert torch.equal(shared[~mined], plain[~mined])


def test_weight_share_with_the_miners_weights_equals_it_without():
    # W_i always uses the loss's own Tn / Tp: with RankedListMiner's pairs and weights at the
    # same margin and Tn, the lists, the within-query weights and the shares are the loss's own.
    from pml_rank_plugins.miners import RankedListMiner

    x, labels = embeddings(n=16, dim=3, seed=42)
    loss_fn = RankedListLoss(0.4, 10.0, query_weighting="weight_share", reducer=PerQuery())
    pairs = RankedListMiner(0.4, 10.0)(x, labels)
    a, b = loss_fn(x, labels, pairs), loss_fn(x, labels)
    assert (b > 0).sum() >= 4
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("query_weighting", ["mean", "weight_share"])
def test_half_precision_loss_in_embeddings_dtype_computed_in_float32(half, query_weighting):
    x, labels = make_embeddings_and_labels(n=24, dim=6, dtype=half, seed=43)
    loss_fn = RankedListLoss(query_weighting=query_weighting)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    assert loss.dtype == half and grad.dtype == half and loss.item() > 0
    ref = loss_fn(x.detach().float(), labels)  # the same numbers in float32
    assert ref.dtype == torch.float32
    assert torch.equal(loss, ref.to(half))


@pytest.mark.parametrize("bad", ["Mean", "caffe", "negative_share", "", None, 1, True])
def test_bad_query_weighting_raises_naming_the_argument_and_choices(bad):
    with pytest.raises(ValueError, match=r"query_weighting must be one of 'mean', 'weight_share'"):
        RankedListLoss(query_weighting=bad)


def test_query_weighting_from_a_config():
    # A constructor keyword, so a config reaches it:
    # loss_funcs: {metric_loss: {pml_rank_plugins.RankedListLoss: {query_weighting: ...}}}
    from pml_rank_plugins.experiment.instantiate import build_object

    where = "loss_funcs.metric_loss"
    spec = {"pml_rank_plugins.RankedListLoss": {"query_weighting": "weight_share", "Tn": 12.0}}
    loss_fn = build_object(spec, where)
    assert isinstance(loss_fn, RankedListLoss) and loss_fn.query_weighting == "weight_share"
    x, labels = embeddings(n=10, seed=44)
    expected = RankedListLoss(Tn=12.0, query_weighting="weight_share")(x, labels)
    torch.testing.assert_close(loss_fn(x, labels), expected, rtol=0, atol=0)
    bad = {"pml_rank_plugins.RankedListLoss": {"query_weighting": "share"}}
    with pytest.raises(ValueError, match=rf"{where}: .*query_weighting must be one of"):
        build_object(bad, where)
