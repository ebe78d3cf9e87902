"""The query weighting of the Ranked List Loss (functional/query_weighting.py): ``log W_i`` and
the authors' Caffe-layer shares ``N c_i = N 0.5 W_i / sum_k W_k`` against plain loops."""

import math

import pytest
import torch

import pml_rank_plugins.functional.query_weighting as query_weighting
import pml_rank_plugins.functional.ranked_list as ranked_list
import pml_rank_plugins.functional.ranked_list.params as ranked_list_params
from pml_rank_plugins.functional.query_weighting import (
    QUERY_WEIGHTINGS,
    check_query_weighting,
    log_weight_sums,
    query_scales,
)

ALPHA, MARGIN = 1.2, 0.4


def mined_problem(n=6, m=9, seed=0):
    """Distances in [0, 2] with disjoint masks of mined positives (d > alpha - m) and mined
    negatives (d < alpha); row 0 has nothing mined."""
    gen = torch.Generator().manual_seed(seed)
    dist = torch.rand(n, m, generator=gen, dtype=torch.float64) * 2
    same = torch.rand(n, m, generator=gen) < 0.4
    pos = same & (dist > ALPHA - MARGIN)
    neg = ~same & (dist < ALPHA)
    pos[0], neg[0] = False, False
    return dist, pos, neg


def loop_weight_sums(dist, pos, neg, Tn, Tp):
    """W_i = sum_{pos} exp(Tp (d - (alpha - m))) + sum_{neg} exp(Tn (alpha - d)), one pair at a
    time in Python floats."""
    out = []
    for i in range(dist.shape[0]):
        total = 0.0
        for j in range(dist.shape[1]):
            d = float(dist[i, j])
            if pos[i, j]:
                total += math.exp(Tp * (d - (ALPHA - MARGIN)))
            elif neg[i, j]:
                total += math.exp(Tn * (ALPHA - d))
        out.append(total)
    return out


@pytest.mark.parametrize("Tn,Tp", [(10.0, 0.0), (3.0, 2.0), (0.0, 0.0)])
def test_log_weight_sums_match_the_loop(Tn, Tp):
    dist, pos, neg = mined_problem()
    log_w = log_weight_sums(dist, pos, neg, ALPHA, MARGIN, Tn, Tp)
    expected = [
        math.log(w) if w > 0 else float("-inf") for w in loop_weight_sums(dist, pos, neg, Tn, Tp)
    ]
    assert log_w.dtype == torch.float64 and log_w.shape == (dist.shape[0],)
    assert log_w[0] == float("-inf")  # nothing mined
    torch.testing.assert_close(log_w, torch.tensor(expected, dtype=torch.float64))


def test_log_weight_sums_are_float64_constants_and_finite_where_exp_overflows():
    dist, pos, neg = mined_problem(seed=1)
    d32 = dist.float().requires_grad_()
    log_w = log_weight_sums(d32, pos, neg, ALPHA, MARGIN, 1000.0, 0.0)
    assert log_w.dtype == torch.float64 and not log_w.requires_grad
    # exp(1000 (alpha - d)) overflows float64, its log does not: the largest term dominates.
    rows = neg.any(1)
    largest = torch.where(neg, 1000.0 * (ALPHA - d32.detach().double()), float("-inf")).amax(1)
    assert torch.isfinite(log_w[rows]).all()
    assert (log_w[rows] >= largest[rows]).all()
    assert (log_w[rows] <= largest[rows] + math.log(dist.shape[1])).all()


def test_query_scales_are_n_times_the_caffe_shares():
    dist, pos, neg = mined_problem(seed=2)
    Tn, Tp = 5.0, 1.0
    scales = query_scales(log_weight_sums(dist, pos, neg, ALPHA, MARGIN, Tn, Tp), Tn, Tp)
    w = loop_weight_sums(dist, pos, neg, Tn, Tp)
    n = len(w)
    expected = torch.tensor([n * 0.5 * wi / sum(w) for wi in w], dtype=torch.float64)
    torch.testing.assert_close(scales, expected, rtol=1e-12, atol=0.0)
    assert scales[0] == 0.0  # nothing mined: no share
    torch.testing.assert_close(scales.sum(), torch.tensor(0.5 * n, dtype=torch.float64))


def test_query_scales_with_nothing_mined_or_no_queries_are_zero():
    assert query_scales(torch.full((3,), float("-inf"), dtype=torch.float64), 1.0, 0.0).eq(0).all()
    assert query_scales(torch.zeros(0, dtype=torch.float64), 1.0, 0.0).shape == (0,)


def test_query_scales_overflowed_log_weight_raises_naming_the_temperatures():
    log_w = torch.tensor([0.0, float("inf")], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"overflow float64 with Tn=1e\+308, Tp=2"):
        query_scales(log_w, 1e308, 2.0)


def test_check_query_weighting():
    assert QUERY_WEIGHTINGS == ("mean", "weight_share")
    for choice in QUERY_WEIGHTINGS:
        assert check_query_weighting(choice) == choice
    for bad in ("Mean", "caffe", None, 1):
        with pytest.raises(
            ValueError, match=r"query_weighting must be one of 'mean', 'weight_share'"
        ):
            check_query_weighting(bad)


def test_moved_helpers_stay_importable_from_the_ranked_list_package():
    for name in ("QUERY_WEIGHTINGS", "check_query_weighting", "log_weight_sums", "query_scales"):
        assert getattr(ranked_list, name) is getattr(query_weighting, name), name
    for name in ranked_list_params.__all__:
        assert getattr(ranked_list, name) is getattr(ranked_list_params, name), name
