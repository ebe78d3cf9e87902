"""RankedListLoss on the gpu / triton backends (run here on CPU): the cpu path's values and
gradients, selection by keyword / use_backend / PML_RANK_BACKEND, no syncing operator and the
operator budget, value checks opt-in, stats as 0-dim tensors."""

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

import pml_rank_plugins.utils.ranked_list_backends as backends_module
from pml_rank_plugins.functional import chunking
from pml_rank_plugins.functional.backend import ENV_VAR, triton_available, use_backend
from pml_rank_plugins.functional.ranked_list import triton_kernel
from pml_rank_plugins.losses import CrossBatchMemory, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.utils.op_count import OpCounter
from tests.conftest import TEST_DEVICE

# The budget for RankedList forward + backward (PML's own RankedListLoss: 145).
OP_BUDGET = 140


class SquaredLp(LpDistance):
    """Another distance object (a subclass): the dense-matrix path."""


def data(n=24, dim=6, classes=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=gen, dtype=dtype)
    return x, torch.randint(0, classes, (n,), generator=gen)


def run(loss_fn, x, labels, **kw):
    """Loss value and gradients w.r.t. x (and ref_emb when it requires grad)."""
    x = x.clone().requires_grad_()
    ref = kw.get("ref_emb")
    inputs = [x] + ([ref] if ref is not None and ref.requires_grad else [])
    loss = loss_fn(x, labels, **kw)
    return loss.detach(), torch.autograd.grad(loss, inputs)


def assert_same(a, b, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    for ga, gb in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(ga, gb, rtol=rtol, atol=atol)


@pytest.fixture(params=["one chunk", "several chunks"])
def chunks(request, monkeypatch):
    if request.param == "several chunks":  # 2 kB: a few rows per chunk
        monkeypatch.setattr(chunking, "gpu_budget_bytes", lambda device: 2048)


OPTIONS = [
    {},
    dict(Tn=25.0, Tp=3.0, imbalance=0.3),
    dict(lam=0.5, query_weighting="weight_share"),
    dict(gallery_gradient=True, Tp=1.0),
    dict(chunk_size=5),
    dict(distance=SquaredLp(power=1)),
    dict(distance=LpDistance(normalize_embeddings=False)),
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_gpu_equals_cpu(options, chunks):
    x, labels = data()
    ref = run(RankedListLoss(**options, backend="cpu"), x, labels)
    ours = run(RankedListLoss(**options, backend="gpu"), x, labels)
    assert_same(ours, ref)
    assert ref[0] > 0


@pytest.mark.parametrize("gallery_gradient", [False, True])
def test_ref_emb_equals_cpu(gallery_gradient, chunks):
    x, labels = data()
    mem, mem_labels = data(n=17, seed=1)
    mem.requires_grad_(gallery_gradient)
    kw = dict(ref_emb=mem, ref_labels=mem_labels)
    results = [
        run(RankedListLoss(gallery_gradient=gallery_gradient, backend=b), x, labels, **dict(kw))
        for b in ("gpu", "cpu")
    ]
    assert_same(*results)


@pytest.mark.parametrize("weighting", ["mean", "weight_share"])
def test_miner_pairs_and_weights_equal_cpu(weighting, chunks):
    x, labels = data(seed=2)
    pairs = RankedListMiner(Tn=5.0, backend="cpu")(x, labels)
    triplets = tuple(t[::7] for t in lmu.get_all_triplets_indices(labels))
    for tuple_ in (pairs, triplets):
        results = [
            run(
                RankedListLoss(query_weighting=weighting, backend=b),
                x,
                labels,
                indices_tuple=tuple_,
            )
            for b in ("gpu", "cpu")
        ]
        assert_same(*results)


def test_memory_bank_self_index_equals_cpu(chunks):
    x, labels = data(n=8, seed=3)
    mem, mem_labels = data(n=32, seed=4)
    results = []
    for b in ("gpu", "cpu"):
        cbm = CrossBatchMemory(RankedListLoss(backend=b), embedding_size=6, memory_size=32)
        cbm.embedding_memory, cbm.label_memory = mem.clone(), mem_labels.clone()
        cbm.has_been_filled = True
        results.append(run(cbm, x, labels))
    assert_same(*results)


def test_selection_by_keyword_context_and_env_var(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)  # the test sets it itself, below
    calls = []
    real = backends_module.gpu_ranked_list_terms
    monkeypatch.setattr(
        backends_module, "gpu_ranked_list_terms", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    x, labels = data(n=8)
    RankedListLoss()(x, labels)
    auto = int(x.device.type != "cpu")  # auto: cpu on the CPU, gpu on an accelerator
    assert len(calls) == auto
    RankedListLoss(backend="gpu")(x, labels)
    assert len(calls) == auto + 1
    with use_backend("gpu"):
        RankedListLoss()(x, labels)
        RankedListLoss(backend="cpu")(x, labels)  # the keyword wins
    assert len(calls) == auto + 2
    monkeypatch.setenv(ENV_VAR, "gpu")
    RankedListLoss()(x, labels)
    assert len(calls) == auto + 3
    with use_backend("cpu"):
        RankedListLoss()(x, labels)
    assert len(calls) == auto + 3
    if triton_available():  # triton runs the fused kernel, never the gpu one
        x32 = x.float()  # float64 is a TypeError on triton (tests/functional/ranked_list)
        if triton_kernel.triton_available_for(x.device):
            RankedListLoss(backend="triton")(x32, labels)
        else:  # CPU tensors outside the interpreter: an error, not a fallback
            with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
                RankedListLoss(backend="triton")(x32, labels)
        assert len(calls) == auto + 3
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=ENV_VAR):
        RankedListLoss()(x, labels)


def test_bad_keywords_are_refused_at_construction():
    with pytest.raises(ValueError, match="backend must be one of"):
        RankedListLoss(backend="cuda")
    with pytest.raises(ValueError, match="check_values"):
        RankedListLoss(check_values="yes")


def test_keywords_come_last_pml_order_kept():
    import inspect

    names = list(inspect.signature(RankedListLoss).parameters)
    assert names[:5] == ["margin", "Tn", "imbalance", "alpha", "Tp"]
    assert names[-3:] == ["backend", "check_values", "kwargs"]


def op_count(n):
    x, labels = data(n=n, dim=16, classes=max(n // 4, 2), dtype=torch.float32)
    x.requires_grad_()
    loss_fn = RankedListLoss(backend="gpu")
    loss_fn(x, labels).backward()  # warm-up outside the count
    with OpCounter(forbid_syncs=True) as ops:
        loss_fn(x, labels).backward()
    return ops


def test_forward_backward_no_sync_and_within_the_operator_budget():
    # Both sizes run as one chunk under the 2 GiB budget (as N = 4096 does: 4096 x 4096 x 20 B
    # = 320 MiB), and at one chunk every operator covers the whole (N, M) block: the count does
    # not depend on N, which the two sizes show.
    small, large = op_count(32), op_count(256)
    assert small.syncs == 0 and large.syncs == 0
    assert small.total == large.total <= OP_BUDGET, dict(small.counts)


def test_value_checks_are_opt_in_on_gpu():
    x, labels = data(n=8)
    x[0, 0] = float("nan")
    RankedListLoss(backend="gpu")(x, labels)  # reads no value: no error (the trainer checks)
    # the cpu backend checks values by default (named: auto is the gpu backend on CUDA)
    for loss_fn in (
        RankedListLoss(backend="gpu", check_values=True),
        RankedListLoss(backend="cpu"),
    ):
        with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
            loss_fn(x, labels)
    x, labels = data(n=8)
    bad = (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([9]))
    with pytest.raises(ValueError, match="has index 9 >= 8"):
        RankedListLoss(backend="gpu", check_values=True)(x, labels, indices_tuple=bad)
    with pytest.raises(ValueError, match="mismatched lengths"):
        RankedListLoss(backend="gpu")(x, labels, indices_tuple=bad[:3] + (bad[3][:0],))


def test_stats_are_device_tensors_on_gpu_with_the_cpu_values():
    x, labels = data(seed=5)
    stats = {}
    for b in ("gpu", "cpu"):
        loss_fn = RankedListLoss(backend=b, collect_stats=True)
        loss_fn(x, labels)
        stats[b] = {
            name: getattr(loss_fn, name)
            for name in (
                "num_pos_pairs",
                "num_neg_pairs",
                "avg_pos_per_query",
                "avg_neg_per_query",
                "num_queries_nothing_mined",
            )
        }
    for name, value in stats["gpu"].items():
        assert isinstance(value, torch.Tensor) and value.ndim == 0, name
        assert value.item() == pytest.approx(stats["cpu"][name]), name
    assert stats["cpu"]["num_pos_pairs"] > 0


def test_empty_batch_and_autocast_dtype_as_cpu():
    x, labels = data(n=8, dtype=torch.float32)
    loss = RankedListLoss(backend="gpu")(x[:0].requires_grad_(), labels[:0])
    assert loss.item() == 0.0
    values = {}
    for b in ("gpu", "cpu"):
        # float32 under autocast, like PML's losses (losses/loss_output.py); both backends alike
        with torch.autocast(TEST_DEVICE.type, dtype=torch.bfloat16):
            out = RankedListLoss(backend=b)(x.bfloat16(), labels)
        assert out.dtype == torch.float32
        values[b] = out.item()
    assert values["gpu"] == pytest.approx(values["cpu"], rel=1e-5)
