"""The fused Triton Ranked List kernel against the ``cpu`` backend (values and gradients).

The kernels run on CPU only in Triton's interpreter, which ``triton.jit`` selects when each
kernel is *decorated* (``TRITON_INTERPRET=1`` before ``functional.ranked_list.triton_jit`` is
imported). So every interpreter case runs in one subprocess with the variable set (:func:`main`
prints one JSON line per case) and each case is one test here reading its record. Small tiles
(16 x 16, several splits) against one tile: both the online softmax across tiles and the merge
of the column splits run. Validation, the split merge, the weight-share log-sums, the route of
other distances and the module without triton are checked in-process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance

from pml_rank_plugins.functional.backend import triton_available
from pml_rank_plugins.functional.chunking import LabelCategories
from pml_rank_plugins.functional.query_weighting import log_weight_sums
from pml_rank_plugins.functional.ranked_list import checked_params, triton_kernel, triton_ops
from pml_rank_plugins.functional.ranked_list.cpu import (
    SparseWeights,
    chunked_ranked_list_terms,
)
from pml_rank_plugins.functional.ranked_list.gpu_steps import (
    DensePairs,
    DenseWeights,
    LabelPairs,
)
from pml_rank_plugins.losses import CrossBatchMemory, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.utils import ranked_list_backends

needs_triton = pytest.mark.skipif(
    not triton_available(), reason="triton is not installed (it is optional)"
)
ROOT = Path(__file__).resolve().parents[3]
Tiles = triton_kernel.Tiles
# Many tiles: 16 x 16 tiles, 16-wide k and d blocks (d = 24 or 32: two of each), and ~8 programs
# wanted, so the forward, grad_Q and grad_R loops are cut into several splits.
SMALL = Tiles(block_n=16, block_m=16, block_k=16, block_d=16, target_programs=8)
ONE = Tiles(block_n=64, block_m=64, block_k=32, block_d=32, target_programs=1)


def _unit(n, d, gen):
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def _cpu_pairs(pairs):
    """The ``cpu`` kernel's categories for a ``gpu``-style pair source."""
    if isinstance(pairs, DensePairs):
        return pairs.categories
    own = pairs.self_columns.reshape(-1) if pairs.self_columns is not None else None
    if pairs.diagonal:
        own = torch.arange(pairs.labels.numel())
    return LabelCategories(pairs.labels.reshape(-1), pairs.ref_labels.reshape(-1), own)


def _compare(name, q, r, pairs, tiles, *, same=False, ref_grad=False, given=None, **params):
    """Triton kernel against ``chunked_ranked_list_terms`` (the ``cpu`` backend) on the same
    float32 inputs: per-query loss, L_P, L_N and counts, and the gradients of ``sum(w * loss)``
    (random ``w``) w.r.t. the queries and, with ``ref_grad`` / ``same``, the references."""
    w = torch.rand(len(q), generator=torch.Generator().manual_seed(5)) + 0.5
    out = {}
    for kind in ("cpu", "triton"):
        qq = q.clone().requires_grad_()
        rr = qq if same else (r.clone().requires_grad_() if ref_grad else r)
        if kind == "cpu":
            weights = None if given is None else SparseWeights(*given)
            terms = chunked_ranked_list_terms(
                qq, rr, _cpu_pairs(pairs), **params, neg_weights=weights, chunk_size=7
            )
        else:
            weights = None if given is None else DenseWeights(*given)
            terms = triton_kernel.triton_ranked_list_terms(
                qq, rr, pairs, **params, neg_weights=weights, tiles=tiles
            )
        wrt = [qq] + ([rr] if ref_grad else [])
        grads = torch.autograd.grad((terms.loss * w).sum(), wrt)
        out[kind] = (terms, grads)
    (a, ga), (b, gb) = out["cpu"], out["triton"]
    value_error = max(float((x.detach() - y.detach()).abs().max() / y.abs().max().clamp_min(1e-3))
                      for x, y in zip(b[:3], a[:3]))  # fmt: skip
    grad_error = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(gb, ga))
    counts = torch.equal(a.num_pos, b.num_pos) and torch.equal(a.num_neg, b.num_neg)
    mined = int(a.num_pos.sum()) > 0 and int(a.num_neg.sum()) > 0
    ok = value_error < 1e-5 and grad_error < 1e-5 and counts and mined
    return dict(case=name, ok=ok, value_error=value_error, grad_error=grad_error, counts=counts)


def _functional_cases():
    gen = torch.Generator().manual_seed(0)
    x, y = _unit(48, 24, gen), torch.randint(0, 6, (48,), generator=gen)
    q, ql = _unit(20, 32, gen), torch.randint(0, 4, (20,), generator=gen)
    bank, bl = _unit(53, 32, gen), torch.randint(0, 4, (53,), generator=gen)
    own = torch.randperm(53, generator=gen)[:20]
    bank[own], bl[own] = q, ql  # the memory bank holds the batch: self_index columns
    cats = torch.randint(0, 3, (30, 48), generator=gen, dtype=torch.int8)
    cats[3] = 2  # a query with no candidate: zero loss, zero gradient
    # Each query's own copy ignored (as the loss does): at distance 0 in exact arithmetic, its
    # computed distance is the square root of rounding errors, different in every kernel.
    cats[torch.arange(30), torch.arange(30)] = 2
    neg = (cats == 1).nonzero()
    given = (neg[:, 0], neg[:, 1], torch.rand(len(neg), generator=gen))
    xs, ys = x[:30], y[:30]
    diag = LabelPairs(ys, ys, diagonal=True)
    full = LabelPairs(y, y, diagonal=True)
    share = dict(query_weighting="weight_share")
    # name: (queries, refs, pairs, tiles, keywords of _compare)
    table = {
        "one_tile_Tn": (xs, xs.detach(), diag, ONE, {}),
        "tiles_Tp_both_ends": (x, x, full, SMALL, dict(same=True, Tp=2.0)),
        "memory_bank_self_index_ref_grad": (
            q,
            bank,
            LabelPairs(ql, bl, own),
            SMALL,
            dict(ref_grad=True),
        ),
        "weight_share_Tp_tiles": (
            x,
            x.detach(),
            full,
            SMALL,
            dict(Tp=3.0, lam=0.5, lam_pos=0.7, **share),
        ),
        "miner_pairs_weights_share": (
            xs,
            x,
            DensePairs(cats),
            SMALL,
            dict(ref_grad=True, given=given, **share),
        ),
        "miner_weights_T0_share": (
            xs,
            x,
            DensePairs(cats),
            ONE,
            dict(given=given, Tn=0.0, **share),
        ),
        "temperatures_zero": (xs, xs.detach(), diag, SMALL, dict(Tn=0.0, Tp=0.0)),
        "temperature_beyond_float32": (xs, xs.detach(), diag, SMALL, dict(Tn=1e39, Tp=1e3)),
    }
    return {
        name: (lambda name=name, args=args: _compare(name, *args[:4], **args[4]))
        for name, args in table.items()
    }


def _loss_case(name, make_loss, mode):
    """End to end through the dispatch point: ``backend="triton"`` equals ``backend="cpu"`` in
    value and embedding gradient (float32 raw embeddings, N = 30, the loss normalizes)."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 12, generator=gen), torch.randint(0, 5, (30,), generator=gen)
    ref, ref_labels = torch.randn(25, 12, generator=gen), torch.randint(0, 5, (25,), generator=gen)
    out = {}
    for backend in ("cpu", "triton"):
        e, r = x.clone().requires_grad_(), ref.clone().requires_grad_()
        loss_func = make_loss(backend)
        if mode == "bank":
            loss_func = CrossBatchMemory(loss_func, embedding_size=12, memory_size=45)
            loss_func(x[:15] * 0.5, y[:15])  # a first batch in the memory bank
            loss = loss_func(e, y)
        elif mode == "miner":
            loss = loss_func(e, y, RankedListMiner(0.4, 10.0, backend="cpu")(x, y))
        else:  # a PML pair tuple against ref_emb, gradient through both
            a1, p = torch.meshgrid(torch.arange(30), torch.arange(25), indexing="ij")
            same = y[a1] == ref_labels[p]
            pairs = (a1[same][::2], p[same][::2], a1[~same][::3], p[~same][::3])
            loss = loss_func(e, y, pairs, ref_emb=r, ref_labels=ref_labels)
        loss.backward()
        grad = e.grad if mode != "ref" else torch.cat([e.grad, r.grad])
        out[backend] = (float(loss.detach()), grad)
    value_error = abs(out["triton"][0] - out["cpu"][0]) / abs(out["cpu"][0])
    grad_error = float((out["triton"][1] - out["cpu"][1]).abs().max() / out["cpu"][1].abs().max())
    ok = value_error < 1e-5 and grad_error < 1e-5
    return dict(case=name, ok=ok, value_error=value_error, grad_error=grad_error)


def _deterministic():
    """Two runs on the same inputs (several tiles and splits) are bit-equal."""
    gen = torch.Generator().manual_seed(2)
    x, y = _unit(36, 16, gen), torch.randint(0, 5, (36,), generator=gen)
    runs = []
    for _ in range(2):
        q = x.clone().requires_grad_()
        terms = triton_kernel.triton_ranked_list_terms(
            q, q, LabelPairs(y, y, diagonal=True), Tp=1.0, query_weighting="weight_share",
            tiles=SMALL,
        )  # fmt: skip
        terms.loss.sum().backward()
        runs.append((terms.loss.detach(), q.grad))
    ok = all(torch.equal(a, b) for a, b in zip(*runs))
    return dict(case="deterministic", ok=ok)


def _half_inputs():
    """float16 embeddings are computed in float32: the loss of their float32 values, gradients
    returned in float16 (the float32 gradient, rounded; the two ends of each pair are cast back
    separately, so up to a float16 rounding apart)."""
    gen = torch.Generator().manual_seed(6)
    x, y = _unit(20, 16, gen).half(), torch.randint(0, 4, (20,), generator=gen)
    out = []
    for dtype in (torch.float16, torch.float32):
        q = x.detach().to(dtype).clone().requires_grad_()
        terms = triton_kernel.triton_ranked_list_terms(
            q, q, LabelPairs(y, y, diagonal=True), tiles=ONE
        )
        terms.loss.sum().backward()
        out.append((terms.loss.detach(), q.grad))
    (loss, grad), (loss32, grad32) = out
    grad_error = float((grad.float() - grad32).abs().max() / grad32.abs().max())
    ok = grad.dtype == torch.float16 and torch.equal(loss, loss32) and grad_error < 1e-3
    return dict(case="float16_upcast", ok=ok, grad_error=grad_error)


def _non_finite():
    """A NaN or inf embedding makes the loss NaN on triton, as on gpu (the signal the trainers'
    check reads; ``check_values=True`` names the cause, tested in-process), never a finite
    loss with the bad row silently left unmined."""
    gen = torch.Generator().manual_seed(7)
    y = torch.arange(20) % 4
    losses = []
    for bad in (float("nan"), float("inf")):
        x = torch.randn(20, 8, generator=gen)
        x[3, 2] = bad
        losses += [float(RankedListLoss(backend=b)(x, y)) for b in ("gpu", "triton")]
    ok = all(value != value for value in losses)
    return dict(case="non_finite_embedding_nan_loss", ok=ok, losses=losses)


def _bad_indices():
    """Out-of-range ``indices_tuple`` and ``self_index`` entries on triton are clamped on the
    device and the loss made NaN (issue 49: never a device-side assert), as on gpu."""
    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(12, 8, generator=gen), torch.arange(12) % 3
    pairs = tuple(torch.tensor([i]) for i in (0, 3, 1, 40))  # negative index 40 of 12
    index = torch.arange(12)
    index[3] = 17  # a memory column that does not exist
    losses = [
        float(RankedListLoss(backend="triton")(x, y, indices_tuple=pairs)),
        float(RankedListLoss(backend="triton")(x, y, ref_emb=x, ref_labels=y, self_index=index)),
        float(RankedListLoss(backend="triton")(x, y)),  # the valid call stays finite
    ]
    ok = losses[0] != losses[0] and losses[1] != losses[1] and losses[2] == losses[2]
    return dict(case="bad_indices_nan_loss", ok=ok, losses=losses)


def _compiled():
    """``torch.compile(fullgraph=True, backend="aot_eager")`` of the loss on triton (through the
    custom operators' fake implementations) equals the eager loss, value and gradient."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, 12, generator=gen), torch.randint(0, 5, (30,), generator=gen)
    loss_func = RankedListLoss(backend="triton", Tp=1.0, query_weighting="weight_share")
    results = []
    # The real glue: one_torch_thread is a no-op while Dynamo traces (chunk_threads).
    for step in (loss_func, torch.compile(loss_func, fullgraph=True, backend="aot_eager")):
        e = x.clone().requires_grad_()
        loss = step(e, y)
        loss.backward()
        results.append((loss.detach(), e.grad))
    torch._dynamo.reset()
    (value, grad), (value_c, grad_c) = results
    value_error = float((value - value_c).abs())
    grad_error = float((grad - grad_c).abs().max())
    ok = value_error <= 1e-7 and grad_error <= 1e-8 and float(grad.abs().max()) > 0
    return dict(case="compiled_fullgraph_aot_eager", ok=ok, value_error=value_error,
                grad_error=grad_error)  # fmt: skip


def _opcheck():
    """``torch.library.opcheck`` (schema, autograd registration, fake tensors, AOT dispatch) on
    both operators, with labels + diagonal and with dense categories + miner weights."""
    gen = torch.Generator().manual_seed(4)
    q, y = _unit(20, 12, gen).requires_grad_(), torch.randint(0, 5, (20,), generator=gen)
    cats = torch.randint(0, 3, (20, 20), generator=gen, dtype=torch.int8)
    wgt = torch.rand(20, 20, generator=gen)
    tiles, _ = ONE.encode()
    results = []
    for pairs in ((y, y, None, None, None, True), (None, None, None, cats, wgt, False)):
        args = (q, q.detach(), *pairs, 1.2, 0.4, 10.0, 1.0, 1.0, 1.0, True, tiles, "tf32x3")
        results.append(torch.library.opcheck(triton_ops.ranked_list_op, args))
        coef = torch.rand(4, 20, generator=gen)
        for of_queries in (True, False):
            args = (q.detach(), q.detach(), *pairs[:5], coef, pairs[5], 1.2, 0.4, 10.0, 1.0,
                    of_queries, tiles, "tf32x3")  # fmt: skip
            results.append(torch.library.opcheck(triton_ops.ranked_list_grad_op, args))
    ok = all(v == "SUCCESS" for result in results for v in result.values())
    return dict(case="opcheck", ok=ok, results=results)


def _graph_safe():
    """The CUDA-graph check of ``tests/graph_safety.py`` on the triton backend."""
    from tests.graph_safety import assert_graph_safe

    trace = assert_graph_safe(RankedListLoss(backend="triton"))
    return dict(case="graph_safe_triton", ok=len(trace.trace) > 10, operators=len(trace.trace))


def cases():
    """``{name: thunk}`` of every interpreter case; each thunk returns a record with ``ok``."""
    return {
        **_functional_cases(),
        "loss_memory_bank": lambda: _loss_case(
            "loss_memory_bank", lambda b: RankedListLoss(backend=b), "bank"
        ),
        "loss_miner_weight_share": lambda: _loss_case(
            "loss_miner_weight_share",
            lambda b: RankedListLoss(backend=b, query_weighting="weight_share"),
            "miner",
        ),
        "loss_pairs_ref_emb_gallery_gradient": lambda: _loss_case(
            "loss_pairs_ref_emb_gallery_gradient",
            lambda b: RankedListLoss(backend=b, gallery_gradient=True, imbalance=0.3),
            "ref",
        ),
        "deterministic": _deterministic,
        "float16_upcast": _half_inputs,
        "non_finite_embedding_nan_loss": _non_finite,
        "bad_indices_nan_loss": _bad_indices,
        "compiled_fullgraph_aot_eager": _compiled,
        "opcheck": _opcheck,
        "graph_safe_triton": _graph_safe,
    }


def main() -> None:
    """Runs every case (in a process with ``TRITON_INTERPRET=1``); prints one JSON line each."""
    if not triton_kernel.interpreted():
        raise SystemExit("run with TRITON_INTERPRET=1 set before the kernels are imported")
    torch.set_num_threads(1)
    for name, thunk in cases().items():
        try:
            record = thunk()
        except Exception as exc:  # reported by the test of this case
            record = dict(case=name, ok=False, error=f"{type(exc).__name__}: {exc}")
        print(json.dumps(record, default=str), flush=True)


@pytest.fixture(scope="module")
def interpreter_results():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = "from tests.functional.ranked_list.test_ranked_list_triton import main; main()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {record["case"]: record for record in records}


@needs_triton
@pytest.mark.parametrize("case", list(cases()))
def test_equals_the_cpu_backend_in_the_interpreter(interpreter_results, case):
    record = interpreter_results[case]
    assert record["ok"], record


# ---- In-process checks: no kernel runs (validation first; pure-torch pieces). ----


def _split_stats(values, mask, T, sign, cuts):
    """``(splits, 3, N)``: each column range's ``(ext, Z, S)`` of ``exp(sign T (v - ext))`` over
    ``mask`` (``ext`` the range's max for sign +1, min for -1; +-inf where nothing is masked)."""
    parts = []
    for lo, hi in zip(cuts, cuts[1:]):
        v, m = values[:, lo:hi], mask[:, lo:hi]
        fill = float("-inf") if sign > 0 else float("inf")
        masked = torch.where(m, v, fill)
        ext = masked.amax(1) if sign > 0 else masked.amin(1)
        safe = torch.where(torch.isfinite(ext), ext, 0.0)
        e = torch.where(m, torch.exp(sign * T * (v - safe[:, None])), 0.0)
        parts.append(torch.stack([ext, e.sum(1), (e * v).sum(1)]))
    return torch.stack(parts)


def test_merge_splits_equals_one_pass_over_all_columns():
    # Three column ranges, one of them with nothing mined for some rows (infinite extremes):
    # merging must give the statistics of a single range over every column.
    gen = torch.Generator().manual_seed(0)
    d = torch.rand(5, 12, generator=gen, dtype=torch.float64) * 1.5
    pos, neg = torch.rand(5, 12, generator=gen) < 0.4, torch.rand(5, 12, generator=gen) < 0.5
    pos[:, 4:8] = False
    neg[1] = False  # a row with no negative anywhere
    g = torch.rand(5, 12, generator=gen, dtype=torch.float64)
    cuts, whole = [0, 4, 8, 12], [0, 12]
    for given in (False, True):

        def stats(c, given=given):
            p = _split_stats(d, pos, 3.0, 1.0, c)
            n = _split_stats(d, neg, 10.0, -1.0, c)
            if given:  # a miner's weights: ext = the largest weight, e = g / ext
                parts = []
                for lo, hi in zip(c, c[1:]):
                    w = torch.where(neg[:, lo:hi], g[:, lo:hi], 0.0)
                    ext = w.amax(1)
                    e = w / torch.where(ext > 0, ext, 1.0)[:, None]
                    parts.append(torch.stack([ext, e.sum(1), (e * d[:, lo:hi]).sum(1)]))
                n_given = torch.stack(parts)
            count_p = torch.stack([pos[:, lo:hi].sum(1) for lo, hi in zip(c, c[1:])])
            count_n = torch.stack([neg[:, lo:hi].sum(1) for lo, hi in zip(c, c[1:])])
            first = n_given if given else n
            # Rows 8, 9 (the Tn sums beside a miner's weights) are +inf / 0 when not tracked.
            tn = (
                n
                if given
                else torch.stack([torch.full_like(n[:, 0], float("inf")), 0 * n[:, 1]], 1)
            )
            rows = [p[:, 0], p[:, 1], p[:, 2], count_p, first[:, 0], first[:, 1], first[:, 2],
                    count_n, tn[:, 0], tn[:, 1]]  # fmt: skip
            return torch.stack([r.double() for r in rows], dim=1)

        merged = triton_ops.merge_splits(stats(cuts), 10.0, 3.0, given)
        expected = stats(whole)[0]
        for row in range(10):
            ok = torch.isfinite(expected[row])  # extremes of empty rows: any infinity
            torch.testing.assert_close(merged[row][ok], expected[row][ok], rtol=1e-12, atol=0)
            assert torch.equal(torch.isfinite(merged[row]), ok)


def test_log_weight_sums_from_stats_equal_the_dense_ones():
    gen = torch.Generator().manual_seed(1)
    d = torch.rand(6, 9, generator=gen) * 1.6
    pos, neg = torch.rand(6, 9, generator=gen) < 0.4, torch.rand(6, 9, generator=gen) < 0.5
    pos[2], neg[2] = False, False  # nothing mined: log W = -inf
    pos, neg = pos & (d > 0.8), neg & (d < 1.2) & ~pos  # mined, disjoint
    for Tn, Tp in ((10.0, 0.0), (0.0, 2.0), (700.0, 3.0)):
        params = checked_params(1.2, 0.4, Tn, Tp, query_weighting="weight_share")
        ext_p = torch.where(pos, d, float("-inf")).amax(1)
        ext_n = torch.where(neg, d, float("inf")).amin(1)
        e_p = torch.where(pos, torch.exp(Tp * (d - ext_p[:, None].nan_to_num(0.0))), 0.0)
        e_n = torch.where(neg, torch.exp(Tn * (ext_n[:, None].nan_to_num(0.0) - d)), 0.0)
        stats = torch.zeros(10, 6)
        stats[0], stats[1], stats[4], stats[5] = ext_p, e_p.sum(1), ext_n, e_n.sum(1)
        stats[7], stats[8], stats[9] = neg.sum(1), ext_n, e_n.sum(1)
        expected = log_weight_sums(d, pos, neg, 1.2, 0.4, Tn, Tp)
        for given in (False, True):  # with a miner's weights: the Tn rows 8, 9 (count at Tn 0)
            got = triton_kernel.log_weight_sums_from_stats(stats, params, given)
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        assert got[2] == float("-inf")


def _inputs(n=4, m=5, d=3, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q, r = _unit(n, d, gen).to(dtype), _unit(m, d, gen).to(dtype)
    return q, r, LabelPairs(torch.arange(n) % 2, torch.arange(m) % 2)


@needs_triton
@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.ones(4, 3, dtype=torch.float64)), ValueError, "share one float dtype"),
        (dict(dtype=torch.float64), TypeError, "float64.*cpu or gpu backend"),
        (dict(r=torch.ones(5, 2)), ValueError, r"need \(N, d\) queries"),
        (dict(pairs="labels"), TypeError, "LabelPairs or DensePairs"),
        (dict(pairs=DensePairs(torch.zeros(4, 5))), ValueError, r"\(4, 5\) int8"),
        (dict(pairs=DensePairs(torch.zeros(4, 6, dtype=torch.int8))), ValueError, r"\(4, 5\)"),
        (dict(pairs=LabelPairs(torch.arange(3), torch.arange(5))), ValueError, "labels for"),
        (dict(tiles=Tiles(precision="fp16")), ValueError, "tiles.precision"),
        (dict(Tn=-1.0), ValueError, "Tn must be >= 0"),
        (dict(query_weighting="sum"), ValueError, "query_weighting"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, error, match):
    q, r, pairs = _inputs(dtype=change.pop("dtype", torch.float32))
    args = dict(q=q, r=r, pairs=pairs)
    args.update({k: change.pop(k) for k in list(change) if k in args})
    with pytest.raises(error, match=match):
        triton_kernel.triton_ranked_list_terms(args["q"], args["r"], args["pairs"], **change)


@needs_triton
def test_a_device_without_kernels_is_an_error_not_a_fallback():
    # CPU tensors whatever TEST_DEVICE: compiled Triton kernels need a GPU, so outside the
    # interpreter CPU inputs are refused (also through the loss), never sent to the gpu path.
    q, r, pairs = (t.cpu() if isinstance(t, torch.Tensor) else t for t in _inputs())
    if triton_kernel.interpreted():  # this pytest process itself runs with TRITON_INTERPRET=1
        assert triton_kernel.triton_available_for("cpu")
    else:
        assert not triton_kernel.triton_available_for("cpu")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            triton_kernel.triton_ranked_list_terms(q, r, pairs)
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            RankedListLoss(backend="triton")(torch.randn(6, 3), torch.arange(6) % 2)
    meta = LabelPairs(
        torch.zeros(4, dtype=torch.long, device="meta"), torch.zeros(5, device="meta")
    )
    with pytest.raises(RuntimeError, match="got meta"):
        triton_kernel.triton_ranked_list_terms(q.to("meta"), r.to("meta"), meta)


@needs_triton
@pytest.mark.parametrize("distance", [LpDistance(power=2), LpDistance(p=1)])
def test_other_distances_take_the_gpu_dense_route(monkeypatch, distance):
    # The documented route: no Euclidean structure to fuse, so the distance object is called
    # and the gpu dense kernel runs (on CPU tensors too); the fused kernel is not reached.
    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel was called for a non-Euclidean distance")

    monkeypatch.setattr(ranked_list_backends, "triton_ranked_list_terms", refuse)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 5, generator=gen), torch.arange(12) % 3
    results = []
    for backend in ("gpu", "triton"):
        e = x.clone().requires_grad_()
        loss = RankedListLoss(backend=backend, distance=distance, alpha=2.0, margin=0.5)(e, y)
        loss.backward()
        results.append((loss.detach(), e.grad))
    assert float(results[0][1].abs().max()) > 0
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_triton
def test_check_values_names_a_non_finite_embedding_before_any_kernel():
    x = torch.randn(6, 3)
    x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        RankedListLoss(backend="triton", check_values=True)(x, torch.arange(6) % 2)


def test_module_imports_without_triton(monkeypatch):
    """Importing never fails without triton; the kernel then says what is missing."""
    from pml_rank_plugins.functional import ranked_list

    monkeypatch.setitem(sys.modules, "triton", None)  # ``import triton`` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    # Fresh imports of the kernel modules (the operators' module stays: a custom operator is
    # registered once per process); sys.modules and the package attributes are restored after.
    for name in ("triton_kernel", "triton_jit"):
        monkeypatch.setattr(ranked_list, name, getattr(ranked_list, name), raising=False)
        monkeypatch.delitem(sys.modules, f"{ranked_list.__name__}.{name}", raising=False)
    module = importlib.import_module(f"{ranked_list.__name__}.triton_kernel")
    assert module is not triton_kernel
    assert module.triton is None and not module.interpreted()
    assert not module.triton_available_for("cuda") and not module.triton_available_for("cpu")
    q, r, pairs = _inputs()
    with pytest.raises(RuntimeError, match="needs the triton package"):
        module.triton_ranked_list_terms(q, r, pairs)


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["stats_kernel", "grad_queries_kernel", "grad_refs_kernel"])
@pytest.mark.parametrize("dense", [False, True], ids=["labels", "dense_given"])
def test_kernels_compile_for_a_cuda_gpu_without_one(kernel, dense):
    # The interpreter is lenient (numpy); Triton's compiler is not. Compiling ahead of time for
    # sm_90 (no GPU needed: triton's own ptxas) checks what a GPU would build at the defaults.
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pml_rank_plugins.functional.ranked_list import triton_jit

    if triton_kernel.interpreted():
        pytest.skip("TRITON_INTERPRET=1 in this process: the kernels are interpreted functions")
    fn = getattr(triton_jit, kernel)
    consts = dict(BLOCK_N=64, BLOCK_M=64, BLOCK_K=32, DENSE=dense, HAS_SELF=not dense,
                  DIAGONAL=False, GIVEN=dense, POS_T0=dense, NEG_T0=False, PRECISION="tf32x3")  # fmt: skip
    if kernel == "stats_kernel":
        consts["TRACK_TN"] = dense
    else:
        consts["BLOCK_D"] = 128
    types = {"lab_ptr": "*i64", "rlab_ptr": "*i64", "self_ptr": "*i64", "cat_ptr": "*i8"}
    floats = {"alpha", "thr", "Tn", "Tp"}
    signature = {
        name: "constexpr" if name in consts else types.get(
            name, "*fp32" if name.endswith("_ptr") else "fp32" if name in floats else "i32"
        )
        for name in fn.arg_names
    }  # fmt: skip
    source = ASTSource(fn=fn, signature=signature, constexprs=consts)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=4, num_stages=2))  # fmt: skip
    assert ".entry " + fn.fn.__name__ in compiled.asm["ptx"] and len(compiled.asm["cubin"]) > 0
