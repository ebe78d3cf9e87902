import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pml_rank_plugins.functional.ranked_list.cpu as chunked_module
from pml_rank_plugins.functional.chunking import LabelCategories
from pml_rank_plugins.functional.euclidean import euclidean_distances
from pml_rank_plugins.functional.histogram.cpu import pair_categories
from pml_rank_plugins.functional.ranked_list.cpu import (
    SparseWeights,
    chunked_ranked_list_mining,
    chunked_ranked_list_terms,
)
from pml_rank_plugins.functional.ranked_list.reference import (
    mine_non_trivial,
    negative_weights,
    ranked_list_terms,
)

ALPHA, MARGIN = 1.2, 0.4
CHUNKS = [1, 3, 7, None]
PARAMS = [(10.0, 0.0, 1.0), (0.0, 0.0, 1.0), (25.0, 3.0, 0.5)]


@pytest.fixture(params=[0.0, 1.0], ids=["dense-recompute", "sparse"])
def path(request, monkeypatch):
    """Forces every chunk onto one backward strategy: ``SPARSE_FRACTION = 0`` recomputes every
    chunk with a mined pair in the backward, ``1`` keeps every chunk's mined pairs."""
    monkeypatch.setattr(chunked_module, "SPARSE_FRACTION", request.param)
    return request.param


def problem(n=13, m=11, dim=3, seed=0, num_classes=3):
    """Normalized embeddings in a low dimension, so distances spread over [0, 2] and both mined
    and trivial pairs occur."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64))
    r = torch.nn.functional.normalize(torch.randn(m, dim, generator=gen, dtype=torch.float64))
    labels = torch.randint(0, num_classes, (n,), generator=gen)
    ref_labels = torch.randint(0, num_classes, (m,), generator=gen)
    return q, r, labels, ref_labels


def dense_terms(q, r, pos, neg, **kwargs):
    return ranked_list_terms(euclidean_distances(q, r), pos, neg, ALPHA, MARGIN, **kwargs)


def assert_terms_equal(a, b, **tol):
    for name in ("loss", "pos_loss", "neg_loss"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), **tol)
    assert torch.equal(a.num_pos, b.num_pos) and torch.equal(a.num_neg, b.num_neg)


def mined_subset(labels, ref_labels, seed=4):
    """A miner's random subset of the pairs: ``(pos, neg, a2, n, w, gen)``, the negatives'
    indices ``(a2, n)`` with positive weights ``w``; ``gen`` continues the seeded draws."""
    gen = torch.Generator().manual_seed(seed)
    same = labels[:, None] == ref_labels[None]
    keep = torch.rand(same.shape, generator=gen) < 0.7
    pos, neg = same & keep, ~same & keep
    a2, n = neg.nonzero(as_tuple=True)
    w = torch.rand(len(a2), generator=gen, dtype=torch.float64) + 0.05
    return pos, neg, a2, n, w, gen


def chunked_and_dense(q, r, labels, ref_labels, chunk, upstream_seed, **kw):
    """The chunked kernel (label categories) and the dense one on the same problem, both ends
    differentiable: asserts equal terms and gradients, returns ``(chunked, dense)`` terms."""
    pos = labels[:, None] == ref_labels[None]
    q1, r1 = q.clone().requires_grad_(), r.clone().requires_grad_()
    ours = chunked_ranked_list_terms(
        q1, r1, LabelCategories(labels, ref_labels), ALPHA, MARGIN, chunk_size=chunk, **kw
    )
    q2, r2 = q.clone().requires_grad_(), r.clone().requires_grad_()
    ref = dense_terms(q2, r2, pos, ~pos, **kw)
    assert_terms_equal(ours, ref, rtol=1e-12, atol=1e-14)
    generator = torch.Generator().manual_seed(upstream_seed)
    upstream = torch.rand(len(q), dtype=torch.float64, generator=generator)
    g_ours = torch.autograd.grad(ours.loss, (q1, r1), upstream)
    g_ref = torch.autograd.grad(ref.loss, (q2, r2), upstream)
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    return ours, ref


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("Tn,Tp,lam", PARAMS)
def test_chunked_equals_dense_against_references_both_ends(chunk, Tn, Tp, lam, path):
    q, r, labels, ref_labels = problem()
    ours, _ = chunked_and_dense(q, r, labels, ref_labels, chunk, 1, Tn=Tn, Tp=Tp, lam=lam)
    assert ours.num_pos.sum() > 0 and ours.num_neg.sum() > 0


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_self_ranking_both_gradient_modes_equal_dense(chunk, gallery_gradient, path):
    q, _, labels, _ = problem(n=14, seed=2)
    pos = labels[:, None] == labels[None]
    eye = torch.eye(len(q), dtype=torch.bool)
    x1 = q.clone().requires_grad_()
    refs = x1 if gallery_gradient else x1.detach()
    cats = LabelCategories(labels, labels, torch.arange(len(q)))
    ours = chunked_ranked_list_terms(x1, refs, cats, ALPHA, MARGIN, chunk_size=chunk)
    x2 = q.clone().requires_grad_()
    ref = dense_terms(x2, x2 if gallery_gradient else x2.detach(), pos & ~eye, ~pos)
    assert_terms_equal(ours, ref, rtol=1e-12, atol=1e-14)
    (g1,) = torch.autograd.grad(ours.loss.sum(), x1)
    (g2,) = torch.autograd.grad(ref.loss.sum(), x2)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_dense_categories_and_sparse_miner_weights_equal_dense(chunk, path):
    q, r, labels, ref_labels = problem(n=12, m=15, seed=3)
    pos, neg, a2, n, w, gen = mined_subset(labels, ref_labels)
    perm = torch.randperm(len(a2), generator=gen)  # any pair order
    dense_w = torch.zeros(pos.shape, dtype=torch.float64)
    dense_w[a2, n] = w
    q1, r1 = q.clone().requires_grad_(), r.clone().requires_grad_()
    ours = chunked_ranked_list_terms(
        q1,
        r1,
        pair_categories(pos, neg),
        ALPHA,
        MARGIN,
        Tp=2.0,
        lam=0.7,
        neg_weights=SparseWeights(a2[perm], n[perm], w[perm]),
        chunk_size=chunk,
    )
    q2, r2 = q.clone().requires_grad_(), r.clone().requires_grad_()
    ref = dense_terms(q2, r2, pos, neg, Tp=2.0, lam=0.7, neg_weights=dense_w)
    assert_terms_equal(ours, ref, rtol=1e-12, atol=1e-14)
    for a, b in zip(
        torch.autograd.grad(ours.loss.sum(), (q1, r1)),
        torch.autograd.grad(ref.loss.sum(), (q2, r2)),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gradcheck_float64_zero_temperature(path):
    # Tn = Tp = 0: uniform weights, so the constant-weight gradient is the true gradient.
    q, r, labels, ref_labels = problem(n=5, m=6, seed=5)
    q, r = q.requires_grad_(), r.requires_grad_()
    cats = LabelCategories(labels, ref_labels)

    def f(a, b):
        return chunked_ranked_list_terms(a, b, cats, ALPHA, MARGIN, Tn=0.0, chunk_size=2).loss

    assert torch.autograd.gradcheck(f, (q, r))


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_chunked_mining_equals_dense_mining(chunk):
    q, r, labels, ref_labels = problem(n=12, m=10, seed=6)
    same = labels[:, None] == ref_labels[None]
    a1, p, a2, n, w = chunked_ranked_list_mining(
        q, r, LabelCategories(labels, ref_labels), ALPHA, MARGIN, Tn=10.0, chunk_size=chunk
    )
    d = euclidean_distances(q, r)
    pos, neg = mine_non_trivial(d, same, ~same, ALPHA, MARGIN)
    assert torch.equal(torch.stack([a1, p]), torch.stack(pos.nonzero(as_tuple=True)))
    assert torch.equal(torch.stack([a2, n]), torch.stack(neg.nonzero(as_tuple=True)))
    torch.testing.assert_close(w, negative_weights(d, neg, 10.0)[a2, n], rtol=1e-12, atol=1e-14)


def test_temperature_beyond_the_dtype_range_is_finite(path):
    q, r, labels, ref_labels = problem(seed=7)
    q, r = q.float().requires_grad_(), r.float()
    cats = LabelCategories(labels, ref_labels)
    terms = chunked_ranked_list_terms(q, r, cats, ALPHA, MARGIN, Tn=1e39, Tp=3.5e38)
    (g,) = torch.autograd.grad(terms.loss.sum(), q)
    assert torch.isfinite(terms.loss).all() and torch.isfinite(g).all()
    limit = chunked_ranked_list_terms(q, r, cats, ALPHA, MARGIN, Tn=1e30, Tp=1e30)
    torch.testing.assert_close(terms.loss, limit.loss)
    *_, w = chunked_ranked_list_mining(q.detach(), r, cats, ALPHA, MARGIN, Tn=1e39)
    assert torch.isfinite(w).all()
    with pytest.raises(ValueError, match="lam=1e\\+39 exceeds"):
        chunked_ranked_list_terms(q, r, cats, ALPHA, MARGIN, lam=1e39)


def test_bad_inputs_raise():
    q, r, labels, ref_labels = problem(seed=8)
    cats = LabelCategories(labels, ref_labels)
    with pytest.raises(ValueError, match="categories must have shape"):
        chunked_ranked_list_terms(q, r[:-1], cats)
    with pytest.raises(ValueError, match="need \\(N, d\\) queries"):
        chunked_ranked_list_terms(q, r[:, :2], cats)
    with pytest.raises(ValueError, match="share one float dtype"):
        chunked_ranked_list_terms(q, r.float(), cats)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunked_ranked_list_terms(q, r, cats, chunk_size=0)


MEMORY_CHILD = """
import json, sys, torch
from pml_rank_plugins.losses import RankedListLoss
torch.set_num_threads(1)
torch.manual_seed(0)
n = int(sys.argv[1])
x = torch.randn(n, 16, requires_grad=True)
labels = torch.arange(n) // 4
loss_fn = RankedListLoss()
loss_fn(x[:64], labels[:64]).backward()  # warm-up: thread pools, first-touch pages
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS: earlier peaks cannot leak in
base = status("VmRSS:")
loss = loss_fn(x, labels)
loss.backward()
print(json.dumps({"growth": status("VmHWM:") - base, "loss": loss.item()}))
"""


@pytest.mark.slow
def test_memory_n8192_allocates_no_n_by_n_float_tensor():
    # One N x N float32 matrix is 256 MiB at N = 8192 (the dense kernel needed several). The
    # chunked kernel needs O(chunk x N) buffers (a few MiB) + O(N d) + O(mined pairs). VmHWM is
    # reset to the current RSS right before the call, so the growth of the peak over the pre-call
    # RSS bounds everything the call allocated at once. Seeded data: the sparse/dense choice per
    # chunk depends on how many pairs are mined, so the bound is checked on fixed data.
    n = 8192
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "MALLOC_MMAP_THRESHOLD_": "65536",  # freed buffers go back to the OS, not a heap cache
    }
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loss"] > 0
    one_matrix = n * n * 4
    assert result["growth"] < one_matrix / 2, result


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("Tn,Tp,lam", PARAMS)
def test_weight_share_chunked_equals_dense_both_ends(chunk, Tn, Tp, lam, path):
    # query_weighting="weight_share": each chunk adds its rows' log W_i; the shares are applied
    # after all chunks. Same values and gradients as the dense kernel, on both paths.
    q, r, labels, ref_labels = problem(seed=9)
    pos = labels[:, None] == ref_labels[None]
    kw = dict(Tn=Tn, Tp=Tp, lam=lam, query_weighting="weight_share")
    ours, _ = chunked_and_dense(q, r, labels, ref_labels, chunk, 2, **kw)
    plain = dense_terms(q, r, pos, ~pos, Tn=Tn, Tp=Tp, lam=lam)
    assert not torch.allclose(ours.loss, plain.loss)


def test_weight_share_with_sparse_miner_weights_equals_dense(path):
    # W_i uses the kernel's own Tn / Tp also when a miner's weights replace the within-query
    # negative weights.
    q, r, labels, ref_labels = problem(n=12, m=15, seed=10)
    gen = torch.Generator().manual_seed(11)
    same = labels[:, None] == ref_labels[None]
    a2, n = (~same).nonzero(as_tuple=True)
    w = torch.rand(len(a2), generator=gen, dtype=torch.float64) + 0.05
    dense_w = torch.zeros(same.shape, dtype=torch.float64)
    dense_w[a2, n] = w
    kw = dict(Tp=2.0, lam=0.7, query_weighting="weight_share")
    q1, q2 = q.clone().requires_grad_(), q.clone().requires_grad_()
    ours = chunked_ranked_list_terms(
        q1,
        r,
        LabelCategories(labels, ref_labels),
        ALPHA,
        MARGIN,
        chunk_size=4,
        neg_weights=SparseWeights(a2, n, w),
        **kw,
    )
    ref = dense_terms(q2, r, same, ~same, neg_weights=dense_w, **kw)
    assert_terms_equal(ours, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(
        torch.autograd.grad(ours.loss.sum(), q1)[0],
        torch.autograd.grad(ref.loss.sum(), q2)[0],
        rtol=1e-10,
        atol=1e-12,
    )


def test_weight_share_gradcheck_float64_zero_temperature(path):
    # Tn = Tp = 0: uniform weights, W_i = the number of mined pairs: the true gradient.
    q, r, labels, ref_labels = problem(n=5, m=6, seed=12)
    q, r = q.requires_grad_(), r.requires_grad_()
    cats = LabelCategories(labels, ref_labels)

    def f(a, b):
        return chunked_ranked_list_terms(
            a, b, cats, ALPHA, MARGIN, Tn=0.0, chunk_size=2, query_weighting="weight_share"
        ).loss

    assert torch.autograd.gradcheck(f, (q, r))


def test_bad_query_weighting_raises():
    q, r, labels, ref_labels = problem(seed=13)
    with pytest.raises(ValueError, match="query_weighting must be one of 'mean', 'weight_share'"):
        chunked_ranked_list_terms(
            q, r, LabelCategories(labels, ref_labels), query_weighting="negative_share"
        )
