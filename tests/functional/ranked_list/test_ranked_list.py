import math

import pytest
import torch

from pml_rank_plugins.functional.ranked_list.reference import (
    masked_softmax,
    mine_non_trivial,
    negative_weights,
    ranked_list_terms,
)
from tests.reference_ranked_list import reference_terms_from_dist

ALPHA, MARGIN = 1.2, 0.4


def random_problem(n=10, m=14, seed=0, dtype=torch.float64):
    """Distances spread over [0, 2] with both mined and trivial pairs, and disjoint masks."""
    gen = torch.Generator().manual_seed(seed)
    dist = (torch.rand(n, m, generator=gen, dtype=torch.float64) * 2).to(dtype)
    labels = torch.randint(0, 3, (n,), generator=gen)
    ref_labels = torch.randint(0, 3, (m,), generator=gen)
    pos = labels[:, None] == ref_labels[None]
    return dist.requires_grad_(), pos, ~pos


@pytest.mark.parametrize(
    "Tn,Tp,lam", [(10.0, 0.0, 1.0), (0.0, 0.0, 1.0), (3.0, 2.0, 0.5), (50.0, 0.0, 0.0)]
)
def test_terms_match_loop_reference_values_and_gradients(dtype, Tn, Tp, lam):
    dist, pos, neg = random_problem(dtype=dtype)
    terms = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=Tn, Tp=Tp, lam=lam)
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)

    d64 = dist.detach().double().requires_grad_()
    ref = reference_terms_from_dist(d64, pos, neg, ALPHA, MARGIN, Tn, Tp, lam)
    ref_loss = torch.stack([d64.new_zeros(()) + r[0] for r in ref])
    (ref_grad,) = torch.autograd.grad(ref_loss.sum(), d64)

    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(terms.loss.double(), ref_loss.detach(), **tol)
    torch.testing.assert_close(
        terms.pos_loss.double(),
        torch.tensor([float(r[1]) for r in ref], dtype=torch.float64),
        **tol,
    )
    torch.testing.assert_close(
        terms.neg_loss.double(),
        torch.tensor([float(r[2]) for r in ref], dtype=torch.float64),
        **tol,
    )
    assert terms.num_pos.tolist() == [r[3] for r in ref]
    assert terms.num_neg.tolist() == [r[4] for r in ref]
    torch.testing.assert_close(grad.double(), ref_grad, **tol)
    assert (terms.loss >= 0).all()


def test_gradcheck_float64_with_constant_weights():
    dist, pos, neg = random_problem(n=5, m=7, seed=1)
    gen = torch.Generator().manual_seed(3)
    wn = torch.rand(5, 7, generator=gen, dtype=torch.float64) + 0.1
    wp = torch.rand(5, 7, generator=gen, dtype=torch.float64) + 0.1

    def f(d):
        return ranked_list_terms(
            d, pos, neg, ALPHA, MARGIN, lam=0.7, neg_weights=wn, pos_weights=wp
        ).loss

    assert torch.autograd.gradcheck(f, (dist,))


def test_gradcheck_float64_zero_temperatures_is_the_true_gradient():
    # With Tn = Tp = 0 the weights are uniform, so constant weights are the exact gradient.
    dist, pos, neg = random_problem(n=5, m=7, seed=2)
    assert torch.autograd.gradcheck(
        lambda d: ranked_list_terms(d, pos, neg, ALPHA, MARGIN, Tn=0.0, Tp=0.0).loss, (dist,)
    )


def test_zero_temperature_equals_uniform_weights():
    dist, pos, neg = random_problem(seed=4)
    a = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=0.0)
    b = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=7.0, neg_weights=torch.ones_like(dist))
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=1e-14)
    _, mined_neg = mine_non_trivial(dist, pos, neg, ALPHA, MARGIN)
    d = dist.detach()
    for i in range(d.shape[0]):
        if mined_neg[i].any():
            expected = (ALPHA - d[i][mined_neg[i]]).mean()
            torch.testing.assert_close(a.neg_loss[i], expected, rtol=0, atol=1e-14)


def test_large_temperature_approaches_hardest_negative():
    dist, pos, neg = random_problem(seed=5)
    _, mined_neg = mine_non_trivial(dist, pos, neg, ALPHA, MARGIN)
    d = dist.detach()
    for T, tol in [(1e3, 1e-3), (1e30, 1e-14)]:
        terms = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=T)
        assert torch.isfinite(terms.loss).all()
        for i in range(d.shape[0]):
            if mined_neg[i].any():
                hardest = ALPHA - d[i][mined_neg[i]].min()
                assert abs(terms.neg_loss[i].item() - hardest.item()) < tol


def test_masked_softmax_never_overflows_and_handles_empty_rows():
    scores = torch.tensor([[1.0, 0.5, -2.0], [0.3, 0.2, 0.1], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    for T in (0.0, 1.0, 50.0, 1e6, 1e38):
        w = masked_softmax(scores, mask, T)
        assert torch.isfinite(w).all()
        assert (w[~mask] == 0).all()
        assert w[1].sum() == 0
        torch.testing.assert_close(w[[0, 2]].sum(1), torch.ones(2))
    torch.testing.assert_close(masked_softmax(scores, mask, 0.0)[0, :2], torch.tensor([0.5, 0.5]))
    w = masked_softmax(scores, mask, 2.0)[0, :2]
    e = torch.tensor([math.exp(2.0), math.exp(1.0)])
    torch.testing.assert_close(w, e / e.sum())
    # float16 scores with a temperature whose naive exp(T * s) overflows float16 (max 65504)
    w16 = masked_softmax(scores.half(), mask, 50.0)
    assert torch.isfinite(w16).all()


def test_float16_distances_large_temperature_finite():
    dist, pos, neg = random_problem(seed=6, dtype=torch.float16)
    terms = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=50.0, Tp=50.0)
    assert terms.loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
    assert grad.dtype == torch.float16
    assert torch.isfinite(terms.loss).all() and torch.isfinite(grad).all()


def test_gradient_pushes_every_mined_negative_away():
    # Query with negatives at 0.5, 0.9, 1.15 (alpha 1.2, T 10): dL/dd < 0 for each, so gradient
    # descent increases every distance. (PML's version pulls 0.9 and 1.15 closer; see
    # tests/losses/test_ranked_list.py.)
    dist = torch.tensor([[0.5, 0.9, 1.15]], dtype=torch.float64, requires_grad=True)
    neg = torch.ones(1, 3, dtype=torch.bool)
    terms = ranked_list_terms(dist, ~neg, neg, 1.2, 0.4, Tn=10.0)
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
    assert (grad < 0).all(), grad
    w = torch.tensor([math.exp(10 * (1.2 - d)) for d in (0.5, 0.9, 1.15)], dtype=torch.float64)
    torch.testing.assert_close(grad[0], -w / w.sum())


def test_gradient_of_mined_positive_is_its_weight():
    dist = torch.tensor([[0.9, 1.3, 0.2]], dtype=torch.float64, requires_grad=True)
    pos = torch.ones(1, 3, dtype=torch.bool)
    terms = ranked_list_terms(dist, pos, ~pos, 1.2, 0.4, Tn=10.0, Tp=0.0)
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
    torch.testing.assert_close(grad[0], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(terms.pos_loss, torch.tensor([(0.1 + 0.5) / 2], dtype=torch.float64))


def test_nothing_mined_gives_zero_loss_and_zero_gradient():
    dist = torch.tensor([[0.1, 1.5], [1.9, 0.7]], dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[True, False], [False, True]])
    terms = ranked_list_terms(dist, pos, ~pos, 1.2, 0.4)
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
    assert (terms.loss == 0).all() and (grad == 0).all()
    assert terms.num_pos.tolist() == [0, 0] and terms.num_neg.tolist() == [0, 0]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(alpha=0.4, margin=0.4), "alpha must be larger than margin"),
        (dict(alpha=0.3, margin=0.4), "alpha must be larger than margin"),
        (dict(margin=-0.1), "margin must be >= 0"),
        (dict(Tn=-1.0), "Tn must be >= 0"),
        (dict(Tp=-1.0), "Tp must be >= 0"),
        (dict(lam=-1.0), "lam must be >= 0"),
        (dict(Tn=float("nan")), "Tn must be finite"),
        (dict(alpha=float("inf")), "alpha must be finite"),
    ],
)
def test_bad_parameters_raise(kwargs, match):
    dist, pos, neg = random_problem()
    params = dict(alpha=ALPHA, margin=MARGIN) | kwargs
    with pytest.raises(ValueError, match=match):
        ranked_list_terms(dist, pos, neg, **params)


def test_bad_inputs_raise():
    dist, pos, neg = random_problem()
    with pytest.raises(ValueError, match="non-finite"):
        ranked_list_terms(dist.detach().clone().fill_(float("nan")), pos, neg)
    bad = dist.detach().clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="dist contains 1 non-finite"):
        ranked_list_terms(bad, pos, neg)
    with pytest.raises(ValueError, match="share one"):
        ranked_list_terms(dist, pos[:, :-1], neg)
    with pytest.raises(ValueError, match="neg_weights must have shape"):
        ranked_list_terms(dist, pos, neg, neg_weights=torch.ones(3, 3))
    with pytest.raises(ValueError, match="both positive and negative"):
        ranked_list_terms(dist, pos, neg | pos)


def test_negative_weights_are_the_normalized_exponentials():
    dist, pos, neg = random_problem(seed=7)
    _, mined = mine_non_trivial(dist, pos, neg, ALPHA, MARGIN)
    w = negative_weights(dist.detach(), mined, 10.0)
    d = dist.detach()
    for i in range(d.shape[0]):
        raw = torch.where(mined[i], torch.exp(10.0 * (ALPHA - d[i])), 0.0)
        expected = raw / raw.sum() if mined[i].any() else raw
        torch.testing.assert_close(w[i], expected)


def test_tiny_given_weights_are_renormalized_not_overflowed():
    dist, pos, neg = random_problem(seed=8, dtype=torch.float32)
    ones = ranked_list_terms(dist, pos, neg, neg_weights=torch.ones_like(dist))
    tiny = ranked_list_terms(dist, pos, neg, neg_weights=torch.full_like(dist, 1e-44))
    torch.testing.assert_close(tiny.loss, ones.loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_temperatures_beyond_the_dtype_range_give_the_hardest_pair_limit(dtype):
    # Tn = 1e39 / Tp = 3.5e38 exceed float32's largest value: they used to round to inf and give
    # 0 * inf = NaN. Any finite T now works; beyond the range the weights are the T -> inf limit
    # (one-hot on the hardest mined pair), the same as a large representable T.
    dist, pos, neg = random_problem(seed=11, dtype=dtype)
    for kwargs in (dict(Tn=1e39), dict(Tp=3.5e38), dict(Tn=1e300, Tp=1e300)):
        terms = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, **kwargs)
        (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
        assert torch.isfinite(terms.loss).all() and torch.isfinite(grad).all(), kwargs
        limit = {k: 1e30 for k in kwargs}
        expected = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, **limit)
        torch.testing.assert_close(terms.loss, expected.loss)
    w = negative_weights(dist.detach(), neg, 1e39)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(1)[neg.any(1)], torch.ones_like(w[:, 0])[neg.any(1)])


def test_alpha_or_lam_that_overflow_raise_naming_the_parameter():
    dist, pos, neg = random_problem(seed=12, dtype=torch.float32)
    with pytest.raises(ValueError, match="lam=1e\\+39 exceeds the largest torch.float32"):
        ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, lam=1e39)
    with pytest.raises(ValueError, match="alpha=1e\\+39 exceeds the largest torch.float32"):
        ranked_list_terms(dist, pos, neg, 1e39, MARGIN)
    # Each representable, the product is not: L_N ~ alpha, lam * L_N > float32 max.
    with pytest.raises(ValueError, match="overflows torch.float32.*lam=1e\\+30, .*alpha=1e\\+20"):
        ranked_list_terms(dist, pos, neg, 1e20, MARGIN, lam=1e30)
    # float64 holds them: finite.
    terms = ranked_list_terms(dist.double(), pos, neg, 1e20, MARGIN, lam=1e30)
    assert torch.isfinite(terms.loss).all()


def test_empty_inputs_give_empty_terms():
    for n, m in ((0, 5), (4, 0), (0, 0)):
        dist = torch.zeros(n, m, dtype=torch.float64, requires_grad=True)
        mask = torch.zeros(n, m, dtype=torch.bool)
        for Tn in (0.0, 10.0):
            terms = ranked_list_terms(dist, mask, mask, ALPHA, MARGIN, Tn=Tn, Tp=Tn)
            assert terms.loss.shape == (n,) and (terms.loss == 0).all()
            assert terms.num_pos.tolist() == [0] * n


# query_weighting="weight_share": the authors' Caffe layer weights query i by 0.5 W_i / sum_k W_k


@pytest.mark.parametrize("Tn,Tp,lam", [(10.0, 0.0, 1.0), (0.0, 0.0, 1.0), (3.0, 2.0, 0.5)])
def test_weight_share_terms_match_loop_reference_values_and_gradients(dtype, Tn, Tp, lam):
    dist, pos, neg = random_problem(dtype=dtype, seed=13)
    kw = dict(Tn=Tn, Tp=Tp, lam=lam)
    terms = ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, query_weighting="weight_share", **kw)
    upstream = torch.rand(
        len(dist), dtype=torch.float64, generator=torch.Generator().manual_seed(5)
    )
    (grad,) = torch.autograd.grad(terms.loss, dist, upstream.to(dtype))

    d64 = dist.detach().double().requires_grad_()
    ref = reference_terms_from_dist(
        d64, pos, neg, ALPHA, MARGIN, Tn, Tp, lam, query_weighting="weight_share"
    )
    ref_loss = torch.stack([d64.new_zeros(()) + r[0] for r in ref])
    (ref_grad,) = torch.autograd.grad(ref_loss, d64, upstream)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(terms.loss.double(), ref_loss.detach(), **tol)
    torch.testing.assert_close(grad.double(), ref_grad, **tol)
    # L_P, L_N and the counts are those of the paper's terms (unweighted)
    mean = ranked_list_terms(dist.detach(), pos, neg, ALPHA, MARGIN, **kw)
    for name in ("pos_loss", "neg_loss", "num_pos", "num_neg"):
        assert torch.equal(getattr(terms, name), getattr(mean, name)), name
    assert not torch.allclose(terms.loss, mean.loss)


def test_weight_share_hand_worked_example():
    # alpha 1.2, m 0.4, Tn 10, Tp 0. Query 0: one mined negative at d = 1 (W_0 = e^{10 * 0.2}),
    # L_0 = 0.2. Query 1: one mined positive at d = 1 (W_1 = e^0 = 1), L_1 = 1 - 0.8 = 0.2.
    # Query 2: nothing mined (W_2 = 0). Batch loss: 0.5 (0.2 e^2 + 0.2) / (e^2 + 1) = 0.1, where
    # the paper's mean is 0.4 / 3.
    dist = torch.tensor([[1.0, 0.5], [1.0, 1.9], [1.5, 0.5]], dtype=torch.float64)
    dist.requires_grad_()
    pos = torch.tensor([[False, True], [True, False], [False, True]])
    neg = torch.tensor([[True, False], [False, True], [True, False]])
    shared = ranked_list_terms(dist, pos, neg, 1.2, 0.4, Tn=10.0, query_weighting="weight_share")
    e2 = math.exp(2.0)
    c = [0.5 * e2 / (e2 + 1), 0.5 / (e2 + 1), 0.0]
    expected = torch.tensor([3 * c[0] * 0.2, 3 * c[1] * 0.2, 0.0], dtype=torch.float64)
    torch.testing.assert_close(shared.loss, expected, rtol=1e-14, atol=1e-15)
    assert math.isclose(shared.loss.mean().item(), 0.1, rel_tol=1e-14)
    mean = ranked_list_terms(dist, pos, neg, 1.2, 0.4, Tn=10.0)
    assert math.isclose(mean.loss.mean().item(), 0.4 / 3, rel_tol=1e-14)
    (grad,) = torch.autograd.grad(shared.loss.mean(), dist)
    expected_grad = torch.tensor([[-c[0], 0.0], [c[1], 0.0], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-14, atol=1e-15)


def test_weight_share_gradcheck_float64_zero_temperatures():
    # Tn = Tp = 0: uniform weights and W_i = the number of mined pairs (piecewise constant), so
    # the constant-weight gradient is the true gradient.
    dist, pos, neg = random_problem(n=5, m=7, seed=14)

    def f(d):
        return ranked_list_terms(
            d, pos, neg, ALPHA, MARGIN, Tn=0.0, Tp=0.0, query_weighting="weight_share"
        ).loss

    assert torch.autograd.gradcheck(f, (dist,))


def test_weight_share_large_temperatures_stay_finite_or_raise_naming_them():
    # exp(Tn (alpha - d)) overflows float64 from Tn ~ 600, but the shares are a softmax of the
    # log-weights: finite. Only log-weights beyond float64 itself raise.
    dist, pos, neg = random_problem(seed=15)
    for Tn in (1e3, 1e30, 1e300):
        terms = ranked_list_terms(
            dist, pos, neg, ALPHA, MARGIN, Tn=Tn, query_weighting="weight_share"
        )
        (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
        assert torch.isfinite(terms.loss).all() and torch.isfinite(grad).all(), Tn
        assert terms.loss.sum() > 0, Tn
    with pytest.raises(
        ValueError, match="query_weighting='weight_share'.*overflow float64.*Tn=1.7e\\+308"
    ):
        ranked_list_terms(dist, pos, neg, ALPHA, MARGIN, Tn=1.7e308, query_weighting="weight_share")


@pytest.mark.parametrize("bad", ["Mean", "caffe", None, 0])
def test_bad_query_weighting_raises(bad):
    dist, pos, neg = random_problem()
    with pytest.raises(ValueError, match="query_weighting must be one of 'mean', 'weight_share'"):
        ranked_list_terms(dist, pos, neg, query_weighting=bad)


def test_weight_share_empty_inputs_and_nothing_mined():
    for n, m in ((0, 5), (4, 0)):
        dist = torch.zeros(n, m, dtype=torch.float64, requires_grad=True)
        mask = torch.zeros(n, m, dtype=torch.bool)
        terms = ranked_list_terms(dist, mask, mask, query_weighting="weight_share")
        assert terms.loss.shape == (n,) and (terms.loss == 0).all()
    dist = torch.full((3, 4), 1.9, dtype=torch.float64, requires_grad=True)  # every pair trivial
    neg = torch.ones(3, 4, dtype=torch.bool)
    terms = ranked_list_terms(dist, ~neg, neg, query_weighting="weight_share")
    (grad,) = torch.autograd.grad(terms.loss.sum(), dist)
    assert (terms.loss == 0).all() and (grad == 0).all()
