"""The fused Triton soft-histogram kernel against the torch reference (``pair_histograms``).

The kernels run on CPU only in Triton's interpreter, which ``triton.jit`` selects when each kernel
is *decorated* (``TRITON_INTERPRET=1`` must be set before
``functional.histogram.triton_kernel`` is imported; setting it at launch time has no effect). So
the value and gradient checks run in one subprocess with the variable set (:func:`main` checks
every case and prints one JSON line per case), and each case is one test here reading that
subprocess's results. Input validation, and the module without triton, are checked in-process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pml_rank_plugins.functional import histogram
from pml_rank_plugins.functional.backend import triton_available
from pml_rank_plugins.functional.histogram import triton_kernel
from pml_rank_plugins.functional.histogram.cpu import LabelCategories, pair_histograms
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss
from pml_rank_plugins.utils.op_count import SyncError
from tests.graph_safety import assert_graph_safe

needs_triton = pytest.mark.skipif(
    not triton_available(), reason="triton is not installed (it is optional)"
)
ROOT = Path(__file__).resolve().parents[3]
# Small tiles, so that a few rows and columns already need several tiles, several column
# (forward, grad_Q) / row (grad_R) splits and several embedding blocks (d = 37 > 16).
SMALL = triton_kernel.Tiles(block_n=16, block_m=16, block_k=16, block_d=16, target_programs=8)
ONE = triton_kernel.Tiles(block_n=32, block_m=32, block_k=16, block_d=32, target_programs=1)


def _unit(n, d, gen):
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def _compare(name, queries, refs, offset, scale, num_intervals, tiles, *, labels=None,
             ref_labels=None, self_columns=None, categories=None, ref_categories=None,
             same=False):  # fmt: skip
    """Kernel (float32) against the reference (float64 on the same numbers): histograms and the
    gradients of ``sum(w * h)`` for random ``w``; returns one result record."""
    gen = torch.Generator().manual_seed(1)
    if categories is None:
        source = LabelCategories(labels, ref_labels, self_columns)
    else:
        source = categories if ref_categories is None else ref_categories
    results = []
    for kind in ("triton", "reference"):
        dtype = torch.float32 if kind == "triton" else torch.float64
        q = queries.detach().to(dtype).requires_grad_()
        r = q if same else refs.detach().to(dtype).requires_grad_()
        start = time.process_time()
        if kind == "triton":
            h = triton_kernel.triton_pair_histograms(
                q, r, labels, ref_labels, self_columns, offset, scale, num_intervals,
                categories=categories, tiles=tiles,
            )  # fmt: skip
        else:
            h = pair_histograms(q, r, source, offset, scale, num_intervals)
        if not results:
            w = torch.randn(h.shape, generator=gen, dtype=torch.float64)
        grads = torch.autograd.grad((h * w.to(dtype)).sum(), [q] if same else [q, r])
        results.append((h.detach().double(), [g.double() for g in grads]))
        if kind == "triton":
            seconds = time.process_time() - start
    (h, grads), (h_ref, grads_ref) = results
    value_error = float((h - h_ref).abs().max())
    grad_error = max(float(((g - gr).abs().max()) / gr.abs().max().clamp_min(1)) for g, gr in
                     zip(grads, grads_ref))  # fmt: skip
    ok = value_error < 2e-5 * max(1, refs.shape[0] / 10) and grad_error < 2e-5
    return dict(case=name, ok=ok, value_error=value_error, grad_error=grad_error,
                seconds=round(seconds, 2))  # fmt: skip


def _ties():
    """Scores that are exact in float32 and float64 (dyadic): values exactly on every bin centre,
    half-way between centres, and clamped beyond both ends, with ignored pairs."""
    s = torch.tensor([-1.5, -1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    refs = torch.zeros(len(s), 3)
    refs[:, 0] = s
    refs[:, 2] = 1.0
    queries = torch.tensor([[1.0, 0, 0], [-1.0, 0, 0], [0.5, 0, 0.5], [-2.0, 0, 0]])
    gen = torch.Generator().manual_seed(3)
    categories = torch.randint(0, 3, (len(queries), len(s)), generator=gen, dtype=torch.int8)
    return queries, refs, categories


def _half_inputs():
    """float16 embeddings are upcast: the same histograms as their float32 values, gradients
    returned in float16 (equal to the float32 kernel's, rounded)."""
    gen = torch.Generator().manual_seed(4)
    q = _unit(9, 12, gen).half().requires_grad_()
    r = _unit(11, 12, gen).half().requires_grad_()
    labels, ref_labels = torch.arange(9) % 3, torch.arange(11) % 3
    out = {}
    for dtype in (torch.float16, torch.float32):
        qq, rr = (q, r) if dtype == torch.float16 else (q.detach().float(), r.detach().float())
        qq, rr = qq.requires_grad_(), rr.requires_grad_()
        start = time.process_time()
        h = triton_kernel.triton_pair_histograms(qq, rr, labels, ref_labels, None, 5.0, -5.0, 10)
        grads = torch.autograd.grad(h[:, :, 1:].sum() - 2 * h[:, 1, :4].sum(), (qq, rr))
        out[dtype] = (h.detach(), grads, time.process_time() - start)
    (h, grads, seconds), (h32, grads32, _) = out[torch.float16], out[torch.float32]
    value_error = float((h - h32).abs().max())
    grad_error = max(float((g.float() - g32.half().float()).abs().max()) for g, g32 in
                     zip(grads, grads32))  # fmt: skip
    ok = all(g.dtype == torch.float16 for g in grads) and value_error == 0 and grad_error == 0
    return dict(case="float16_upcast", ok=ok, value_error=value_error, grad_error=grad_error,
                seconds=round(seconds, 2))  # fmt: skip


def _loss_case(name, make_loss, miner=False, bank=False):
    """End to end through the dispatch point: the loss with ``backend="triton"`` equals the same
    loss with ``backend="cpu"`` in value and embedding gradient (float32, N = 30)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(30, 12, generator=gen)
    y = torch.randint(0, 5, (30,), generator=gen)
    pairs = None
    if miner:  # every pair of the first 20 rows: a dense-categories call of the kernel
        a, p = torch.meshgrid(torch.arange(20), torch.arange(30), indexing="ij")
        same, other = (y[a] == y[p]) & (a != p), y[a] != y[p]
        pairs = (a[same], p[same], a[other], p[other])
    out = {}
    for backend in ("cpu", "triton"):
        e = x.clone().requires_grad_()
        loss_func = make_loss(backend)
        if bank:
            loss_func = CrossBatchMemory(loss_func, embedding_size=12, memory_size=45)
            loss_func(x[:15] * 0.5, y[:15])  # a first batch in the memory bank
        loss = loss_func(e, y) if pairs is None else loss_func(e, y, pairs)
        loss.backward()
        out[backend] = (float(loss.detach()), e.grad)
    value_error = abs(out["triton"][0] - out["cpu"][0])
    grad_error = float((out["triton"][1] - out["cpu"][1]).abs().max())
    ok = value_error < 1e-5 and grad_error < 1e-6 and float(out["cpu"][1].abs().max()) > 0
    return dict(case=name, ok=ok, value_error=value_error, grad_error=grad_error)


def _losses():
    return {
        "loss_fastap_triton": lambda: _loss_case(
            "loss_fastap_triton", lambda b: FastAPLoss(num_bins=10, backend=b)
        ),
        "loss_map_t_miner_triton": lambda: _loss_case(
            "loss_map_t_miner_triton",
            lambda b: QuantizedAPLoss(num_bins=20, tie_aware=True, backend=b),
            miner=True,
        ),
        "loss_memory_bank_triton": lambda: _loss_case(
            "loss_memory_bank_triton", lambda b: FastAPLoss(num_bins=10, backend=b), bank=True
        ),
        "graph_safe_fastap_triton": lambda: _graph_case(
            "graph_safe_fastap_triton", FastAPLoss(num_bins=10, backend="triton")
        ),
        "graph_safe_map_t_triton": lambda: _graph_case(
            "graph_safe_map_t_triton",
            QuantizedAPLoss(num_bins=20, tie_aware=True, backend="triton"),
        ),
    }


def _graph_case(name, loss):
    """The CUDA-graph check of ``tests/graph_safety.py`` on the triton backend: one operator
    trace (the kernels' host glue and the interpreter's own operators) for batches of one shape
    whatever their values, sync-free, no tensor made from host data after the warm-up."""
    try:
        trace = assert_graph_safe(loss)
    except (AssertionError, SyncError) as error:
        return dict(case=name, ok=False, error=f"{type(error).__name__}: {error}")
    return dict(case=name, ok=len(trace.trace) > 10, operators=len(trace.trace))


def cases():
    """(name, thunk) for every interpreter case; each thunk returns a :func:`_compare` record."""
    gen = torch.Generator().manual_seed(0)
    q, r = _unit(20, 37, gen), _unit(27, 37, gen)
    labels = torch.randint(0, 4, (20,), generator=gen)
    ref_labels = torch.randint(0, 4, (27,), generator=gen)
    dense = torch.randint(0, 3, (20, 27), generator=gen, dtype=torch.int8)
    dense[3] = 2  # a query whose pairs are all ignored: zero histograms, zero gradient
    # The kernel ignores any value other than 0 / 1 (the reference takes only 0, 1, 2).
    dense[:, 5] = 2
    odd = dense.clone()
    odd[:, 5] = 7
    self_columns = torch.randperm(20, generator=gen)
    x, x_labels = _unit(24, 20, gen), torch.randint(0, 6, (24,), generator=gen)
    tq, tr, tcat = _ties()
    return {
        "labels_L10_tiled": lambda: _compare(
            "labels_L10_tiled", q, r, 5.0, -5.0, 10, SMALL, labels=labels, ref_labels=ref_labels
        ),
        "self_columns_L10": lambda: _compare(
            "self_columns_L10",
            q,
            r[:20],
            5.0,
            -5.0,
            10,
            ONE,
            labels=labels,
            ref_labels=ref_labels[:20],
            self_columns=self_columns,
        ),
        "dense_ignored_empty_row_L50": lambda: _compare(
            "dense_ignored_empty_row_L50",
            q,
            r,
            25.0,
            -25.0,
            50,
            ONE,
            categories=odd,
            ref_categories=dense,
        ),
        "queries_are_refs_L10": lambda: _compare(
            "queries_are_refs_L10",
            x,
            x,
            5.0,
            -5.0,
            10,
            SMALL,
            labels=x_labels,
            ref_labels=x_labels,
            self_columns=torch.arange(24),
            same=True,
        ),
        "L1_default_tiles": lambda: _compare(
            "L1_default_tiles",
            x,
            r[:, :20],
            0.5,
            -0.5,
            1,
            triton_kernel.DEFAULT_TILES,
            labels=x_labels,
            ref_labels=ref_labels,
            self_columns=torch.arange(24),
        ),
        "ties_and_clamping_L4": lambda: _compare(
            "ties_and_clamping_L4", tq, tr, 2.0, 2.0, 4, ONE, categories=tcat
        ),
        "ties_and_clamping_descending_L4": lambda: _compare(
            "ties_and_clamping_descending_L4", tq, tr, 2.0, -2.0, 4, ONE, categories=tcat
        ),
        "float16_upcast": _half_inputs,
        **_losses(),
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
        print(json.dumps(record), flush=True)


@pytest.fixture(scope="module")
def interpreter_results():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = "from tests.functional.histogram.test_histogram_triton import main; main()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {record["case"]: record for record in records}


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("case", list(cases()))
def test_equals_reference_in_interpreter(interpreter_results, case):
    record = interpreter_results[case]
    assert record["ok"], record


# ---- In-process checks: validation runs before any kernel, so no interpreter is needed. ----


def _inputs(n=4, m=5, d=3):
    gen = torch.Generator().manual_seed(0)
    return _unit(n, d, gen), _unit(m, d, gen), torch.arange(n) % 2, torch.arange(m) % 2


def _call(q, r, labels, ref_labels, num_intervals=10, **kwargs):
    return triton_kernel.triton_pair_histograms(
        q, r, labels, ref_labels, None, 5.0, -5.0, num_intervals, **kwargs
    )


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.ones(4)), ValueError, "queries must be a 2-D"),
        (dict(r=torch.ones(5, 2)), ValueError, "d = 3 columns, refs 2"),
        (dict(q=torch.ones(4, 3, dtype=torch.float64)), TypeError, "float64"),
        (dict(labels=torch.zeros(3, dtype=torch.long)), ValueError, r"labels must have shape"),
        (dict(ref_labels=torch.zeros(5)), TypeError, "ref_labels must be an integer"),
        (dict(labels=None), ValueError, "labels and ref_labels are required"),
        (dict(r=torch.ones(5, 3, device="meta")), ValueError, "refs on meta"),
        (dict(categories=torch.zeros(4, 5)), TypeError, "categories must be an int8"),
        (dict(categories=torch.zeros(4, 6, dtype=torch.int8)), ValueError, r"shape \(4, 5\)"),
        (dict(num_intervals=0), ValueError, "num_intervals must be an integer >= 1"),
        (dict(num_intervals=128), ValueError, "num_bins <= 127.*num_intervals = 128"),
        (dict(num_intervals=4096), ValueError, "at most 128 bin centres"),
    ],
)
@needs_triton
def test_bad_inputs_raise_clear_errors(change, error, match):
    q, r, labels, ref_labels = _inputs()
    args = dict(q=q, r=r, labels=labels, ref_labels=ref_labels)
    kwargs = {k: v for k, v in change.items() if k in ("categories", "num_intervals")}
    args.update({k: v for k, v in change.items() if k not in kwargs})
    with pytest.raises(error, match=match):
        _call(args["q"], args["r"], args["labels"], args["ref_labels"], **kwargs)


@needs_triton
def test_device_without_kernels_is_an_error():
    # CPU tensors whatever TEST_DEVICE: compiled Triton kernels need a GPU, so CPU inputs are
    # refused on a CUDA machine too (unless the interpreter runs); on the test device they run.
    q, r, labels, ref_labels = (t.cpu() for t in _inputs())
    if triton_kernel.interpreted():  # this pytest process itself runs with TRITON_INTERPRET=1
        assert triton_kernel.triton_available_for("cpu")
        assert not triton_kernel.triton_available_for("meta")
    else:
        assert not triton_kernel.triton_available_for("cpu")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            _call(q, r, labels, ref_labels)
    meta = [t.to("meta") for t in (q, r, labels, ref_labels)]
    with pytest.raises(RuntimeError, match="got meta"):
        _call(*meta)


def test_module_imports_without_triton(monkeypatch):
    """Importing never fails without triton; the kernel then says what is missing."""
    monkeypatch.setitem(sys.modules, "triton", None)  # ``import triton`` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    # A fresh import of both modules; sys.modules and the package's attributes are restored after.
    for name in ("triton_kernel", "triton_jit"):
        monkeypatch.setattr(histogram, name, getattr(histogram, name))
        monkeypatch.delitem(sys.modules, f"{histogram.__name__}.{name}")
    module = importlib.import_module(f"{histogram.__name__}.triton_kernel")
    assert module is not triton_kernel
    assert module.triton is None and not module.interpreted()
    assert not module.triton_available_for("cuda") and not module.triton_available_for("cpu")
    q, r, labels, ref_labels = _inputs()
    with pytest.raises(RuntimeError, match="needs the triton package"):
        module.triton_pair_histograms(q, r, labels, ref_labels, None, 5.0, -5.0, 10)
