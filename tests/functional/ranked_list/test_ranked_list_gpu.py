"""functional/ranked_list_gpu*.py: the gpu backend's RankedList kernels equal the cpu kernels
(values, gradients, mined pairs) at one chunk and several, and dispatch no syncing operator."""

import pytest
import torch

import pml_rank_plugins.functional.ranked_list.gpu_mining as mining_module
from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.chunking import LabelCategories
from pml_rank_plugins.functional.euclidean import euclidean_distances
from pml_rank_plugins.functional.histogram.cpu import pair_categories
from pml_rank_plugins.functional.ranked_list.cpu import (
    SparseWeights,
    chunked_ranked_list_mining,
    chunked_ranked_list_terms,
)
from pml_rank_plugins.functional.ranked_list.gpu import (
    bytes_per_pair,
    chunk_rows_for,
    gpu_ranked_list_terms,
    gpu_ranked_list_terms_dense,
)
from pml_rank_plugins.functional.ranked_list.gpu_mining import (
    gpu_mining_from_dist,
    gpu_ranked_list_mining,
)
from pml_rank_plugins.functional.ranked_list.gpu_steps import (
    DensePairs,
    DenseWeights,
    LabelPairs,
    dense_pair_categories,
)
from pml_rank_plugins.functional.ranked_list.reference import ranked_list_terms
from pml_rank_plugins.functional.sync_free_inputs import normalize_rows
from pml_rank_plugins.functional.validation import normalize_rows as host_normalize_rows
from pml_rank_plugins.functional.validation import validate_indices_tuple
from pml_rank_plugins.utils.op_count import OpCounter
from tests.functional.ranked_list.test_ranked_list_chunked import (
    ALPHA,
    MARGIN,
    PARAMS,
    mined_subset,
    problem,
)

# None: one chunk under the 2 GiB budget; "budget": several chunks from a patched budget.
CHUNKS = [None, 1, 3, 7, "budget"]


@pytest.fixture
def chunk(request, monkeypatch):
    """``chunk_size`` to pass; ``"budget"`` patches ``gpu_budget_bytes`` to 2-4 float64 rows of
    11-15 references (several chunks for every problem here)."""
    if request.param == "budget":
        budget = 4 * 11 * bytes_per_pair(torch.float64)
        monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: budget)
        assert chunk_rows_for(13, 15, None, torch.zeros(1, dtype=torch.float64)) == 2
        return None
    return request.param


def assert_terms_close(a, b):
    for name in ("loss", "pos_loss", "neg_loss"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-14)
    assert torch.equal(a.num_pos, b.num_pos) and torch.equal(a.num_neg, b.num_neg)


def grads(loss, inputs, seed=1):
    upstream = torch.rand(
        len(loss), dtype=loss.dtype, generator=torch.Generator().manual_seed(seed)
    )
    return torch.autograd.grad(loss, inputs, upstream)


def both(fn_gpu, fn_cpu, q, r):
    """Runs the two kernels on fresh leaves; returns (terms, grads) of each."""
    out = []
    for fn in (fn_gpu, fn_cpu):
        q1, r1 = q.clone().requires_grad_(), r.clone().requires_grad_()
        terms = fn(q1, r1)
        out.append((terms, grads(terms.loss, (q1, r1))))
    return out


@pytest.mark.parametrize("chunk", CHUNKS, indirect=True)
@pytest.mark.parametrize("Tn,Tp,lam", PARAMS)
@pytest.mark.parametrize("weighting", ["mean", "weight_share"])
def test_gpu_equals_cpu_label_pairs_both_ends(chunk, Tn, Tp, lam, weighting):
    q, r, labels, ref_labels = problem(n=13, m=11)
    kw = dict(Tn=Tn, Tp=Tp, lam=lam, query_weighting=weighting)
    (t1, g1), (t2, g2) = both(
        lambda a, b: gpu_ranked_list_terms(
            a, b, LabelPairs(labels, ref_labels), ALPHA, MARGIN, chunk_size=chunk, **kw
        ),
        lambda a, b: chunked_ranked_list_terms(
            a, b, LabelCategories(labels, ref_labels), ALPHA, MARGIN, **kw
        ),
        q,
        r,
    )
    assert_terms_close(t1, t2)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert t1.num_pos.sum() > 0 and t1.num_neg.sum() > 0


@pytest.mark.parametrize("chunk", CHUNKS, indirect=True)
@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_self_ranking_both_gradient_modes(chunk, gallery_gradient):
    q, _, labels, _ = problem(n=14, seed=2)
    results = []
    for kernel, pairs in (
        (gpu_ranked_list_terms, LabelPairs(labels, labels, torch.arange(14))),
        (chunked_ranked_list_terms, LabelCategories(labels, labels, torch.arange(14))),
    ):
        x = q.clone().requires_grad_()
        refs = x if gallery_gradient else x.detach()
        kw = dict(chunk_size=chunk) if kernel is gpu_ranked_list_terms else {}
        terms = kernel(x, refs, pairs, ALPHA, MARGIN, **kw)
        results.append((terms, grads(terms.loss, (x,))[0]))
    assert_terms_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", CHUNKS, indirect=True)
@pytest.mark.parametrize("weighting", ["mean", "weight_share"])
def test_miner_pairs_and_weights_equal_cpu(chunk, weighting):
    q, r, labels, ref_labels = problem(n=12, m=15, seed=3)
    pos, neg, a2, n, w, gen = mined_subset(labels, ref_labels)
    a1, p = pos.nonzero(as_tuple=True)
    perm = torch.randperm(len(a2), generator=gen)  # any pair order
    kw = dict(Tp=2.0, lam=0.7, query_weighting=weighting)
    cats = dense_pair_categories(12, 15, a1, p, a2, n)
    assert torch.equal(cats, pair_categories(pos, neg))
    (t1, g1), (t2, g2) = both(
        lambda a, b: gpu_ranked_list_terms(
            a,
            b,
            DensePairs(cats),
            ALPHA,
            MARGIN,
            neg_weights=DenseWeights(a2[perm], n[perm], w[perm]),
            chunk_size=chunk,
            **kw,
        ),
        lambda a, b: chunked_ranked_list_terms(
            a,
            b,
            pair_categories(pos, neg),
            ALPHA,
            MARGIN,
            neg_weights=SparseWeights(a2[perm], n[perm], w[perm]),
            **kw,
        ),
        q,
        r,
    )
    assert_terms_close(t1, t2)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 2])
@pytest.mark.parametrize("weighting", ["mean", "weight_share"])
def test_gradcheck_float64_zero_temperature(chunk_size, weighting):
    # Tn = Tp = 0: uniform weights, so the constant-weight gradient is the true gradient.
    q, r, labels, ref_labels = problem(n=5, m=6, seed=5)
    pairs = LabelPairs(labels, ref_labels)

    def f(a, b):
        return gpu_ranked_list_terms(
            a, b, pairs, ALPHA, MARGIN, Tn=0.0, chunk_size=chunk_size, query_weighting=weighting
        ).loss

    assert torch.autograd.gradcheck(f, (q.requires_grad_(), r.requires_grad_()))


@pytest.mark.parametrize("Tn,Tp,lam", PARAMS)
def test_dense_distance_path_equals_dense_kernel(Tn, Tp, lam):
    q, r, labels, ref_labels = problem(n=9, m=10, seed=6)
    pos = labels[:, None] == ref_labels[None]
    out = []
    for kernel in (gpu_ranked_list_terms_dense, ranked_list_terms):
        q1 = q.clone().requires_grad_()
        terms = kernel(euclidean_distances(q1, r), pos, ~pos, ALPHA, MARGIN, Tn, Tp, lam)
        out.append((terms, grads(terms.loss, (q1,))[0]))
    assert_terms_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-10, atol=1e-12)


def test_no_syncing_operator_forward_and_backward_at_one_and_several_chunks():
    q, r, labels, ref_labels = problem(n=13, m=11)
    for chunk_size in (None, 4):
        q1, r1 = q.clone().requires_grad_(), r.clone().requires_grad_()
        with OpCounter(forbid_syncs=True) as ops:
            terms = gpu_ranked_list_terms(
                q1,
                r1,
                LabelPairs(labels, ref_labels),
                ALPHA,
                MARGIN,
                Tp=1.0,
                chunk_size=chunk_size,
                query_weighting="weight_share",
            )
            terms.loss.sum().backward()
        assert ops.syncs == 0 and ops.total > 0


def test_one_chunk_under_the_budget_and_rows_from_bytes_per_pair(monkeypatch):
    q = torch.zeros(4096, 8)
    assert chunk_rows_for(4096, 4096, None, q) == 4096  # 4096 x 4096 x 20 B < 2 GiB
    assert bytes_per_pair(torch.float32) == 20 and bytes_per_pair(torch.float64) == 36
    monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: 100 * 4096 * 20)
    assert chunk_rows_for(4096, 4096, None, q) == 100
    assert chunk_rows_for(4096, 4096, 7, q) == 7  # chunk_size overrides


@pytest.mark.parametrize("chunk", CHUNKS, indirect=True)
def test_mining_equals_cpu_mining_with_one_host_read(chunk, monkeypatch):
    q, r, labels, ref_labels = problem(n=13, m=11, seed=7)
    reads = []
    real = mining_module.host_counts
    monkeypatch.setattr(mining_module, "host_counts", lambda c: reads.append(1) or real(c))
    with OpCounter() as ops:
        ours = gpu_ranked_list_mining(q, r, LabelPairs(labels, ref_labels), chunk_size=chunk)
    # the one read (host_counts: on an accelerator a device-to-host _to_copy, which the counter
    # counts as a sync; nothing on the CPU); nothing else syncs
    one_read = {} if q.device.type == "cpu" else {"_to_copy": 1}
    assert len(reads) == 1 and dict(ops.sync_counts) == one_read, dict(ops.sync_counts)
    ref = chunked_ranked_list_mining(q, r, LabelCategories(labels, ref_labels))
    for a, b in zip(ours[:4], ref[:4], strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(ours[4], ref[4], rtol=1e-12, atol=1e-14)
    assert len(ours[0]) > 0 and len(ours[2]) > 0


def test_mining_from_a_distance_matrix_equals_chunked_mining():
    q, r, labels, ref_labels = problem(n=10, m=12, seed=8)
    ours = gpu_mining_from_dist(euclidean_distances(q, r), LabelPairs(labels, ref_labels))
    ref = chunked_ranked_list_mining(q, r, LabelCategories(labels, ref_labels))
    for a, b in zip(ours[:4], ref[:4], strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(ours[4], ref[4], rtol=1e-12, atol=1e-14)


def test_sync_free_normalize_equals_the_host_one_values_and_gradients():
    x = torch.randn(6, 5, dtype=torch.float64)
    x[1] = 0.0  # a zero row: zero value, zero gradient
    x[2] *= 1e300  # overflows the plain norm: rescaled
    x[3] *= 1e-13  # below eps: x / eps, zero gradient
    upstream = torch.randn(6, 5, dtype=torch.float64)
    out = []
    for fn in (normalize_rows, host_normalize_rows):
        x1 = x.clone().requires_grad_()
        with OpCounter(forbid_syncs=fn is normalize_rows):
            value = fn(x1)
            (g,) = torch.autograd.grad(value, x1, upstream)
        out.append((value, g))
    if x.device.type == "cpu":
        assert torch.equal(out[0][0], out[1][0])
    else:
        # CUDA's float64 norm kernel rounds the power-of-two-scaled rows (every row with a
        # max-abs >= 1 here, only the overflowing one there) a few ulps differently: the
        # values agree to rounding, not bit for bit (first CUDA run of the suite, issue 49).
        torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-14, atol=0)
    assert torch.all(out[0][0][1] == 0) and torch.all(out[1][0][1] == 0)  # the zero row, exactly
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-12, atol=1e-300)
    assert torch.all(out[0][1][[1, 3]] == 0)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(normalize_rows, (x,))


def test_structural_indices_tuple_checks_read_no_value():
    a = torch.tensor([0, 1])
    with OpCounter(forbid_syncs=True):
        validate_indices_tuple((a, a, a, a), 2, 2, check_values=False)
        validate_indices_tuple((a, a, torch.tensor([5]), torch.tensor([-1])), 2, 2, False)
    with pytest.raises(ValueError, match=r"indices_tuple\[3\] \(negatives\) has negative"):
        validate_indices_tuple((a, a, torch.tensor([0]), torch.tensor([-1])), 2, 2, True)
    with pytest.raises(ValueError, match="mismatched lengths"):
        validate_indices_tuple((a, a, a, torch.tensor([0])), 2, 2, False)
    with pytest.raises(ValueError, match="integer indices"):
        validate_indices_tuple((a, a, a.float()), 2, 2, False)
    with pytest.raises(ValueError, match="3 \\(triplets\\) or 4"):
        validate_indices_tuple((a, a), 2, 2, False)


def test_bad_inputs_raise():
    q, r, labels, ref_labels = problem(n=4, m=5)
    pairs = LabelPairs(labels, ref_labels)
    with pytest.raises(ValueError, match="share one float dtype"):
        gpu_ranked_list_terms(q, r.float(), pairs)
    with pytest.raises(ValueError, match=r"need \(N, d\) queries"):
        gpu_ranked_list_terms(q, r[:, :2], pairs)
    with pytest.raises(ValueError, match="alpha must be larger than margin"):
        gpu_ranked_list_terms(q, r, pairs, alpha=0.3, margin=0.4)
    with pytest.raises(ValueError, match="query_weighting"):
        gpu_ranked_list_terms(q, r, pairs, query_weighting="sum")
    bad = q.clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="overflows"):
        gpu_ranked_list_terms(bad, r, pairs, check_values=True)
