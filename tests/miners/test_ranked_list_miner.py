import copy
import math
import pickle

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import ContrastiveLoss, MarginLoss, MultiSimilarityLoss
from pytorch_metric_learning.miners import BaseMiner
from pytorch_metric_learning.reducers import SumReducer
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_rank_plugins.losses import RankedListLoss
from pml_rank_plugins.miners import RankedListMiner, WeightedPairs
from tests.conftest import TEST_DEVICE, make_embeddings_and_labels

ALPHA, MARGIN = 1.2, 0.4


def loop_mining(x, labels, ref=None, ref_labels=None, alpha=ALPHA, margin=MARGIN, Tn=10.0):
    """RLL's non-trivial pairs and normalized negative weights, one pair at a time."""
    self_mode = ref is None
    if self_mode:
        ref, ref_labels = x, labels
    pos, neg, weights = [], [], {}
    for i in range(len(x)):
        q = x[i].double() / x[i].double().norm()
        raw = {}
        for j in range(len(ref)):
            if self_mode and i == j:
                continue
            d = (q - ref[j].double() / ref[j].double().norm()).norm().item()
            if labels[i] == ref_labels[j] and d > alpha - margin:
                pos.append((i, j))
            elif labels[i] != ref_labels[j] and d < alpha:
                neg.append((i, j))
                raw[j] = math.exp(Tn * (alpha - d))
        total = sum(raw.values())
        weights.update({(i, j): w / total for j, w in raw.items()})
    return pos, neg, weights


def pairs_of(a, b):
    return list(zip(a.tolist(), b.tolist(), strict=True))


@pytest.mark.parametrize("Tn", [0.0, 10.0, 40.0])
def test_mined_pairs_and_weights_match_loop(dtype, Tn):
    x, labels = make_embeddings_and_labels(n=16, dim=4, num_classes=4, dtype=dtype, seed=0)
    out = RankedListMiner(Tn=Tn)(x, labels)
    pos, neg, weights = loop_mining(x.detach(), labels, Tn=Tn)
    assert sorted(pairs_of(out[0], out[1])) == sorted(pos)
    assert sorted(pairs_of(out[2], out[3])) == sorted(neg)
    expected = torch.tensor([weights[k] for k in pairs_of(out[2], out[3])], dtype=torch.float64)
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.weights.double(), expected, **tol)


def test_ref_emb_mining_matches_loop():
    x, labels = make_embeddings_and_labels(n=8, dim=4, num_classes=2, seed=1)
    r, ref_labels = make_embeddings_and_labels(n=10, dim=4, num_classes=2, seed=2)
    out = RankedListMiner()(x, labels, r, ref_labels)
    pos, neg, weights = loop_mining(x.detach(), labels, r.detach(), ref_labels)
    assert sorted(pairs_of(out[0], out[1])) == sorted(pos)
    assert sorted(pairs_of(out[2], out[3])) == sorted(neg)
    expected = torch.tensor([weights[k] for k in pairs_of(out[2], out[3])], dtype=torch.float64)
    torch.testing.assert_close(out.weights, expected)


def test_output_is_a_valid_pml_pair_tuple():
    x, labels = make_embeddings_and_labels(n=16, dim=4, seed=3)
    miner = RankedListMiner(collect_stats=True)
    out = miner(x, labels)
    assert isinstance(out, WeightedPairs) and isinstance(out, tuple) and len(out) == 4
    BaseMiner.output_assertion(miner, out)
    assert miner.num_pos_pairs == len(out[0]) > 0 and miner.num_neg_pairs == len(out[2]) > 0
    converted = lmu.convert_to_pairs(out, labels)
    assert converted is out and converted.weights is out.weights
    a1, p, a2, n = out  # unpacks like any pair tuple
    assert len(out.weights) == len(a2) == len(n)
    for clone in (copy.copy(out), copy.deepcopy(out), pickle.loads(pickle.dumps(out))):
        assert isinstance(clone, WeightedPairs)
        torch.testing.assert_close(clone.weights, out.weights)
        assert all(torch.equal(u, v) for u, v in zip(clone, out, strict=True))


@pytest.mark.parametrize("loss_cls", [ContrastiveLoss, MultiSimilarityLoss, MarginLoss])
def test_pml_pair_losses_accept_the_output_unchanged(loss_cls):
    x, labels = make_embeddings_and_labels(n=16, dim=4, seed=4)
    out = RankedListMiner()(x, labels)
    plain = tuple(out)
    loss_fn = loss_cls()
    with_weights = loss_fn(x, labels, out)
    torch.testing.assert_close(with_weights, loss_fn(x, labels, plain))
    assert torch.isfinite(with_weights)
    torch.autograd.grad(with_weights, x)


@pytest.mark.parametrize("gallery_gradient", [False, True])
@pytest.mark.parametrize("Tn", [0.0, 10.0])
def test_loss_with_internal_mining_equals_loss_fed_by_miner(dtype, gallery_gradient, Tn):
    x, labels = make_embeddings_and_labels(n=24, dim=6, num_classes=4, dtype=dtype, seed=5)
    loss_fn = RankedListLoss(Tn=Tn, gallery_gradient=gallery_gradient)
    internal = loss_fn(x, labels)
    fed = loss_fn(x, labels, RankedListMiner(Tn=Tn)(x, labels))
    g_internal, g_fed = (torch.autograd.grad(v, x)[0] for v in (internal, fed))
    torch.testing.assert_close(fed, internal)
    torch.testing.assert_close(g_fed, g_internal)


def test_loss_fed_by_miner_with_ref_emb():
    x, labels = make_embeddings_and_labels(n=12, dim=4, num_classes=3, seed=6)
    r, ref_labels = make_embeddings_and_labels(n=15, dim=4, num_classes=3, seed=7)
    loss_fn = RankedListLoss(gallery_gradient=True)
    internal = loss_fn(x, labels, ref_emb=r, ref_labels=ref_labels)
    fed = loss_fn(x, labels, RankedListMiner()(x, labels, r, ref_labels), r, ref_labels)
    torch.testing.assert_close(fed, internal)
    for a, b in zip(
        torch.autograd.grad(fed, (x, r)), torch.autograd.grad(internal, (x, r)), strict=True
    ):
        torch.testing.assert_close(a, b)


def test_miner_weights_replace_the_loss_temperature():
    x, labels = make_embeddings_and_labels(n=16, dim=4, seed=8)
    mined = RankedListMiner(Tn=10.0)(x, labels)
    fed = RankedListLoss(Tn=0.0)(x, labels, mined)
    torch.testing.assert_close(fed, RankedListLoss(Tn=10.0)(x, labels))
    assert not torch.allclose(fed, RankedListLoss(Tn=0.0)(x, labels))
    # Without .weights the same pairs get the loss's own Tn weights.
    torch.testing.assert_close(
        RankedListLoss(Tn=0.0)(x, labels, tuple(mined)), RankedListLoss(Tn=0.0)(x, labels)
    )


def test_float16_embeddings_large_temperature():
    x, labels = make_embeddings_and_labels(n=32, dim=8, dtype=torch.float16, seed=9)
    out = RankedListMiner(Tn=50.0)(x, labels)
    assert out.weights.dtype == torch.float32 and torch.isfinite(out.weights).all()
    loss = RankedListLoss(Tn=50.0)(x, labels, out)
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # per anchor the weights sum to 1
    sums = torch.zeros(32, device=x.device).index_add_(0, out[2], out.weights)
    has = torch.zeros(32, dtype=torch.bool, device=x.device)
    has[out[2]] = True
    torch.testing.assert_close(sums[has], torch.ones(int(has.sum()), device=x.device))


def test_nothing_mined_gives_empty_pairs_and_zero_loss():
    x = torch.eye(4, dtype=torch.float64).repeat_interleave(2, 0).requires_grad_()
    labels = torch.arange(4).repeat_interleave(2)
    miner = RankedListMiner(collect_stats=True)
    out = miner(x, labels)
    assert all(len(t) == 0 for t in out) and len(out.weights) == 0
    assert miner.num_anchors_nothing_mined == 8
    loss_fn = RankedListLoss(collect_stats=True)
    loss = loss_fn(x, labels, out)
    assert loss.item() == 0.0 and loss_fn.num_queries_nothing_mined == 8
    assert (torch.autograd.grad(loss, x)[0] == 0).all()


def test_bad_inputs_raise():
    x, labels = make_embeddings_and_labels(n=8, dim=4, seed=10)
    with pytest.raises(ValueError, match="alpha must be larger than margin"):
        RankedListMiner(alpha=0.3, margin=0.4)
    with pytest.raises(ValueError, match="Tn must be >= 0"):
        RankedListMiner(Tn=-2.0)
    with pytest.raises(ValueError, match="not a similarity"):
        RankedListMiner(distance=CosineSimilarity())
    bad = x.detach().clone()
    bad[1, 2] = float("nan")
    # value checks (finiteness, weights) are opt-in on the gpu backend (auto on CUDA)
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        RankedListMiner(check_values=True)(bad, labels)
    with pytest.raises(ValueError, match="Number of embeddings must equal number of labels"):
        RankedListMiner()(x, labels[:-1])
    with pytest.raises(ValueError, match="needs labels"):
        RankedListMiner()(x, None)
    with pytest.raises(ValueError, match="needs labels"):
        RankedListMiner()(x, labels, x.detach())
    i = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="mismatched lengths"):
        WeightedPairs(i, i, i, i, weights=torch.ones(3))
    with pytest.raises(ValueError, match="mismatched lengths"):
        WeightedPairs(i, i[:1], i, i, weights=torch.ones(2))
    # a pair tuple whose weights do not line up with its negative pairs
    out = RankedListMiner()(x, labels)
    broken = copy.copy(out)
    broken.weights = out.weights[:-1]
    with pytest.raises(ValueError, match="mismatched lengths"):
        RankedListLoss()(x, labels, broken)
    broken.weights = -out.weights
    with pytest.raises(ValueError, match=">= 0"):
        RankedListLoss(check_values=True)(x, labels, broken)
    broken.weights = out.weights.clone().fill_(float("inf"))
    with pytest.raises(ValueError, match="non-finite"):
        RankedListLoss(check_values=True)(x, labels, broken)


def test_contrastive_loss_on_mined_pairs_is_rll_pair_margin_loss():
    # ContrastiveLoss(pos_margin=alpha - m, neg_margin=alpha) on RLL's pairs is eq. 8 summed.
    x, labels = make_embeddings_and_labels(n=16, dim=4, seed=11)
    pairs = RankedListMiner()(x, labels)
    loss = ContrastiveLoss(pos_margin=ALPHA - MARGIN, neg_margin=ALPHA, reducer=SumReducer())
    value = loss(x, labels, pairs)
    pos, neg, _ = loop_mining(x.detach(), labels)
    xn = [v / v.norm() for v in x.detach()]
    expected = sum((xn[i] - xn[j]).norm() - (ALPHA - MARGIN) for i, j in pos)
    expected = expected + sum(ALPHA - (xn[i] - xn[j]).norm() for i, j in neg)
    torch.testing.assert_close(value, expected)


def test_temperature_beyond_float32_range_gives_finite_weights():
    # Used to give NaN weights (Tn rounded to inf in float32).
    x, labels = make_embeddings_and_labels(n=16, dim=4, dtype=torch.float32, seed=20)
    out = RankedListMiner(Tn=1e39)(x, labels)
    limit = RankedListMiner(Tn=1e30)(x, labels)
    assert torch.isfinite(out.weights).all() and len(out.weights) > 0
    torch.testing.assert_close(out.weights, limit.weights)


def test_empty_batch_or_ref_emb_gives_empty_tuples():
    # Used to raise IndexError from amin().
    x, labels = make_embeddings_and_labels(n=8, dim=4, seed=21)
    empty_x, empty_labels = x[:0], labels[:0]
    miner = RankedListMiner(collect_stats=True)
    for args in ((empty_x, empty_labels), (x, labels, empty_x.detach(), empty_labels)):
        out = miner(*args)
        assert isinstance(out, WeightedPairs)
        assert all(len(t) == 0 for t in out) and len(out.weights) == 0
        assert miner.num_pos_pairs == 0 and miner.num_neg_pairs == 0
    assert miner.num_anchors_nothing_mined == 8


def test_autocast_bfloat16_mines_in_float32():
    # Used to fail under autocast / return bfloat16 weights.
    gen = torch.Generator().manual_seed(22)
    model = torch.nn.Linear(16, 8)
    inputs = torch.randn(48, 16, generator=gen)
    labels = torch.arange(48) % 6
    with torch.autocast(TEST_DEVICE.type, dtype=torch.bfloat16):
        emb = model(inputs)
        out = RankedListMiner()(emb, labels)
        loss = RankedListLoss()(emb, labels, out)
    assert out.weights.dtype == torch.float32 and torch.isfinite(out.weights).all()
    assert loss.dtype == torch.float32  # float32 under autocast, as PML's losses (issue 41)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    # The same pairs as mining the bfloat16 embeddings in float32 outside autocast.
    ref = RankedListMiner()(emb.detach().float(), labels)
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    torch.testing.assert_close(out.weights, ref.weights)
    # Within bfloat16 tolerance of mining the float32 embeddings.
    loss32 = RankedListLoss()(model(inputs), labels, RankedListMiner()(model(inputs), labels))
    torch.testing.assert_close(loss.float(), loss32, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("chunk_size", [1, 3, None])
def test_chunked_mining_equals_dense_distance_path(chunk_size):
    from pytorch_metric_learning.distances import LpDistance

    class DenseLp(LpDistance):
        """A subclass: mined from its dense (N, M) matrix (the generic path)."""

    x, labels = make_embeddings_and_labels(n=20, dim=3, num_classes=4, seed=23)
    r, ref_labels = make_embeddings_and_labels(n=13, dim=3, num_classes=4, seed=24)
    for args in ((x, labels), (x, labels, r, ref_labels)):
        ours = RankedListMiner(chunk_size=chunk_size)(*args)
        dense = RankedListMiner(distance=DenseLp())(*args)
        assert all(torch.equal(a, b) for a, b in zip(ours, dense, strict=True))
        torch.testing.assert_close(ours.weights, dense.weights, rtol=1e-12, atol=1e-14)
        assert len(ours[0]) > 0 and len(ours[2]) > 0


def test_nothing_mined_counts_anchors_without_any_pair():
    # 3-d unit vectors (distances on the unit sphere; alpha = 1.2, alpha - margin = 0.8):
    # q0, q1 (class 0) are close (their positive pair is trivial) and both 0.96 from q2: each
    # has negatives only. q2, q3 (class 1) are opposite: a non-trivial positive; q3 has that
    # positive only (1.76 from q0/q1 > alpha). q4, q5 (class 2) are close to each other and
    # orthogonal to all the others (distance sqrt(2) > alpha): nothing mined.
    def unit(*v):
        v = torch.tensor(v, dtype=torch.float64)
        return v / v.norm()

    x = torch.stack(
        [
            unit(1.0, 0.0, 0.0),
            unit(1.0, 0.01, 0.0),
            unit(math.cos(1.0), math.sin(1.0), 0.0),
            unit(-math.cos(1.0), -math.sin(1.0), 0.0),
            unit(0.0, 0.0, 1.0),
            unit(0.0, 0.01, 1.0),
        ]
    )
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    pos, neg, _ = loop_mining(x, labels)
    anchors_pos, anchors_neg = {i for i, _ in pos}, {i for i, _ in neg}
    # the construction holds: negatives only, a positive only, both, and nothing
    assert anchors_neg - anchors_pos == {0, 1} and anchors_pos - anchors_neg == {3}
    assert anchors_pos & anchors_neg == {2}
    miner = RankedListMiner(collect_stats=True)
    out = miner(x, labels)
    assert sorted(pairs_of(out[0], out[1])) == sorted(pos)
    assert sorted(pairs_of(out[2], out[3])) == sorted(neg)
    assert miner.num_anchors_nothing_mined == 2  # q4 and q5
    miner(x, labels, x.clone(), labels.clone(), self_index=torch.arange(6))
    assert miner.num_anchors_nothing_mined == 2  # the memory-bank form counts the same


@pytest.mark.parametrize("precision", [torch.float32, torch.float16, torch.bfloat16])
def test_self_index_leaves_out_copies_that_rounding_puts_beyond_a_small_positive_boundary(
    precision,
):
    # A query and its own copy in ref_emb (a memory bank's slot) are at distance 0 exactly, but
    # the distance computed in floating point is not: about 1e-4 (the square root of rounding
    # errors near 0). With a positive boundary alpha - margin below that, the copy would be
    # mined as a non-trivial positive pair of the query with itself; self_index leaves it out,
    # as PML's remove_self_comparisons would afterwards.
    x, labels = make_embeddings_and_labels(64, 32, 8, precision, seed=30, requires_grad=False)
    others, other_labels = make_embeddings_and_labels(16, 32, 8, precision, 31, requires_grad=False)
    memory, memory_labels = torch.cat([others, x]), torch.cat([other_labels, labels])
    slots = torch.arange(16, 80, device=x.device)
    miner = RankedListMiner(margin=0.4, alpha=0.4 + 1e-5)
    plain = miner(x, labels, memory, memory_labels)
    self_pairs = plain[1] == slots[plain[0]]
    assert self_pairs.any()  # rounding did put copies beyond the boundary
    got = miner(x, labels, memory, memory_labels, self_index=slots)
    assert not (got[1] == slots[got[0]]).any()
    want = lmu.remove_self_comparisons(plain, slots, len(memory))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    torch.testing.assert_close(got.weights, plain.weights, rtol=0, atol=0)
    # with the paper's boundary (0.8) the copies are trivial positives: self_index changes nothing
    paper = RankedListMiner(margin=0.4, alpha=1.2)
    with_index = paper(x, labels, memory, memory_labels, self_index=slots)
    without = paper(x, labels, memory, memory_labels)
    assert all(torch.equal(a, b) for a, b in zip(with_index, without, strict=True))
