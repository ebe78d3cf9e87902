import torch
from pytorch_metric_learning.distances import LpDistance, SNRDistance

from pml_rank_plugins.utils.loss_and_miner_utils import distance_matrix
from tests.conftest import make_embeddings_and_labels


def test_matches_the_distance_object():
    x, _ = make_embeddings_and_labels(n=30, dim=6, seed=0)
    r, _ = make_embeddings_and_labels(n=28, dim=6, seed=1)
    for dist in (LpDistance(), LpDistance(normalize_embeddings=False), LpDistance(power=2)):
        torch.testing.assert_close(distance_matrix(dist, x, r), dist(x, r))
        torch.testing.assert_close(distance_matrix(dist, x, x), dist(x, x))
    snr = SNRDistance()
    torch.testing.assert_close(distance_matrix(snr, x, r), snr(x, r))


def test_gallery_gradient_switch():
    x, _ = make_embeddings_and_labels(n=8, dim=3, seed=2)
    r, _ = make_embeddings_and_labels(n=9, dim=3, seed=3)
    gx, gr = torch.autograd.grad(
        distance_matrix(LpDistance(), x, r, False).sum(), (x, r), allow_unused=True
    )
    assert gr is None and gx.abs().sum() > 0
    # batch as its own gallery: gradient only through the query side of each pair
    g_self = torch.autograd.grad(distance_matrix(LpDistance(), x, x, False).sum(), x)[0]
    g_query = torch.autograd.grad(LpDistance()(x, x.detach()).sum(), x)[0]
    torch.testing.assert_close(g_self, g_query)
    g_both = torch.autograd.grad(distance_matrix(LpDistance(), x, x, True).sum(), x)[0]
    torch.testing.assert_close(g_both, torch.autograd.grad(LpDistance()(x, x).sum(), x)[0])


def test_records_distance_stats():
    x, _ = make_embeddings_and_labels(n=8, dim=3, seed=4)
    dist = LpDistance(collect_stats=True)
    distance_matrix(dist, 3 * x, 3 * x)
    assert abs(dist.final_avg_query_norm - 1.0) < 1e-9 and dist.initial_avg_query_norm > 1.0
