"""The Triton histogram kernels as ``torch.library`` custom ops (``pml_rank::``), and the
``triton`` backend under ``torch.compile(fullgraph=True)``.

On CPU the kernels run only in Triton's interpreter, set before the kernels are imported, so the
checks that launch them run in one subprocess with ``TRITON_INTERPRET=1`` (:func:`main`, one JSON
line per case; one test per case here, as ``test_histogram_triton.py`` does):

* ``torch.library.opcheck`` of both operators (schema, autograd registration, fake tensor,
  AOT dispatch with dynamic shapes) with labels, with ``self_columns`` and with dense categories
  (the optional label tensors ``None``);
* eager calls run ``EagerPairHistograms`` (no dispatcher), bit-identical to the op called
  directly; the kernel entry point compiled with ``fullgraph=True`` (the op) equals eager,
  values and gradients;
* every loss on ``backend="triton"`` compiled with ``fullgraph=True`` (``aot_eager``: the custom
  op is opaque, and its real implementation runs the interpreted kernels) in one graph, equal to
  eager; the Ranked List loss runs the ``gpu`` path on this backend.

The fake implementations' shapes and dtypes, and the tile encoding, are checked in-process (meta
tensors reach the fake implementation; nothing is launched).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import run_and_get_code

from pml_rank_plugins.functional.backend import triton_available
from pml_rank_plugins.functional.histogram import triton_kernel, triton_ops
from pml_rank_plugins.functional.histogram.triton_launch import DEFAULT_TILES, Tiles
from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss

needs_triton = pytest.mark.skipif(
    not triton_available(), reason="triton is not installed (it is optional)"
)
ROOT = Path(__file__).resolve().parents[3]
SMALL = Tiles(block_n=16, block_m=16, block_k=16, block_d=16, target_programs=2)


def _inputs(n=7, m=9, d=5):
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    r = torch.nn.functional.normalize(torch.randn(m, d, generator=gen), dim=1)
    labels, ref_labels = torch.randint(0, 3, (n,), generator=gen), torch.arange(m) % 3
    categories = torch.randint(0, 3, (n, m), generator=gen, dtype=torch.int8)
    return q, r, labels, ref_labels, categories


def _opcheck_cases():
    q, r, labels, ref_labels, categories = _inputs()
    sizes, precision = SMALL.encode()
    q, r = q.requires_grad_(), r.requires_grad_()
    own = torch.randperm(7, generator=torch.Generator().manual_seed(1))
    sources = {
        "labels": (labels, ref_labels, None, None),
        "self_columns": (labels, ref_labels, own, None),
        "dense": (None, None, None, categories),
    }
    cases = {
        f"opcheck_forward_{name}": (
            triton_ops.histograms_op,
            (q, r, *source, 5.0, -5.0, 10, sizes, precision),
        )
        for name, source in sources.items()
    }
    slope = torch.randn(7, 2, 11, generator=torch.Generator().manual_seed(2))
    for of_queries in (True, False):
        cases[f"opcheck_backward_{'queries' if of_queries else 'refs'}"] = (
            triton_ops.gradient_op,
            (slope, q.detach(), r.detach(), *sources["self_columns"], 5.0, -5.0, 10, sizes,
             precision, of_queries),  # fmt: skip
        )
    return cases


def _opcheck(op, args):
    results = torch.library.opcheck(op, args)
    return dict(ok=all(v == "SUCCESS" for v in results.values()), results=results)


def _value_and_grad(fn, x, *args):
    e = x.detach().clone().requires_grad_()
    value = fn(e, *args)
    (grad,) = torch.autograd.grad(value, e)
    return value.detach(), grad


def _compiled_equals_eager(fn, x, *args, graphs=1):
    """``fn`` compiled with ``fullgraph=True`` (``aot_eager``) against eager: one record."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    value, grad = _value_and_grad(torch.compile(fn, fullgraph=True, backend=counter), x, *args)
    expected_value, expected_grad = _value_and_grad(fn, x, *args)
    value_error = float((value - expected_value).abs().max())
    grad_error = float((grad - expected_grad).abs().max())
    ok = (
        counter.frame_count == graphs
        and value_error <= 1e-6
        and grad_error <= 1e-6
        and float(expected_grad.abs().max()) > 0
    )
    return dict(ok=ok, graphs=counter.frame_count, value_error=value_error, grad_error=grad_error)


def _kernel_case(dense: bool):
    """The entry point ``triton_pair_histograms`` compiled (``refs`` the queries themselves:
    the same tensor as two op inputs), values and gradients of a weighted sum."""
    q, _, labels, _, _ = _inputs(n=9)
    w = torch.randn(9, 2, 11, generator=torch.Generator().manual_seed(3))
    cat = torch.randint(0, 3, (9, 9), generator=torch.Generator().manual_seed(4)).to(torch.int8)

    def weighted(x):
        hist = triton_kernel.triton_pair_histograms(
            x, x, None if dense else labels, None if dense else labels, None, 5.0, -5.0, 10,
            categories=cat if dense else None, tiles=SMALL,
        )  # fmt: skip
        return (hist * w).sum()

    return _compiled_equals_eager(weighted, q)


def _op_equals_eager_function():
    """Eager calls run :class:`EagerPairHistograms`; the op called directly (what a compiled
    graph runs) gives the same histograms and gradients, bit for bit."""
    q, r, labels, ref_labels, _ = _inputs()
    w = torch.randn(7, 2, 11, generator=torch.Generator().manual_seed(7))
    sizes, precision = SMALL.encode()
    out = {}
    for path in ("eager", "op"):
        qq, rr = q.clone().requires_grad_(), r.clone().requires_grad_()
        if path == "eager":
            h = triton_kernel.triton_pair_histograms(qq, rr, labels, ref_labels, None, 5.0, -5.0,
                                                     10, tiles=SMALL)  # fmt: skip
            grad_fn = type(h.grad_fn).__name__
        else:
            h = triton_ops.histograms_op(qq, rr, labels, ref_labels, None, None, 5.0, -5.0, 10,
                                         sizes, precision)  # fmt: skip
        out[path] = (h.detach(), *torch.autograd.grad((h * w).sum(), (qq, rr)))
    same = all(torch.equal(a, b) for a, b in zip(out["eager"], out["op"]))
    ok = same and grad_fn == "EagerPairHistogramsBackward" and float(out["op"][1].abs().max()) > 0
    return dict(ok=ok, same=same, grad_fn=grad_fn)


def _loss_cases():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 6, generator=gen)
    y = torch.arange(16) % 4
    a, p = torch.meshgrid(torch.arange(12), torch.arange(16), indexing="ij")
    same, other = (y[a] == y[p]) & (a != p), y[a] != y[p]
    pairs = (a[same], p[same], a[other], p[other])  # a miner's pairs: dense categories
    fastap = FastAPLoss(num_bins=10, backend="triton")
    map_t = QuantizedAPLoss(num_bins=12, tie_aware=True, backend="triton")
    rll = RankedListLoss(backend="triton", query_weighting="weight_share")
    return {
        "fullgraph_fastap": lambda: _compiled_equals_eager(lambda e, t: fastap(e, t), x, y),
        "fullgraph_map_t_mined_pairs": lambda: _compiled_equals_eager(
            lambda e, t: map_t(e, t, pairs), x, y
        ),
        "fullgraph_ranked_list": lambda: _compiled_equals_eager(lambda e, t: rll(e, t), x, y),
        "fullgraph_memory_bank": lambda: _bank_case(x, y),
    }


def _bank_case(x, y):
    """Two steps of a FastAP memory bank (one graph per queue position): compiled equals an
    eager twin at each."""
    torch._dynamo.reset()
    banks = [
        CrossBatchMemory(FastAPLoss(num_bins=10, backend="triton"), embedding_size=6,
                         memory_size=16)  # fmt: skip
        for _ in range(2)
    ]
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda e, t: banks[0](e, t), fullgraph=True, backend=counter)
    errors = []
    for half in (slice(0, 8), slice(8, 16)):
        value, grad = _value_and_grad(compiled, x[half], y[half])
        expected_value, expected_grad = _value_and_grad(lambda e, t: banks[1](e, t), x[half],
                                                        y[half])  # fmt: skip
        errors.append(max(float((value - expected_value).abs()),
                          float((grad - expected_grad).abs().max())))  # fmt: skip
    same_memory = torch.equal(banks[0].embedding_memory, banks[1].embedding_memory)
    ok = counter.frame_count == 2 and max(errors) <= 1e-6 and same_memory
    return dict(ok=ok, graphs=counter.frame_count, errors=errors, same_memory=same_memory)


def _inductor_case():
    """FastAP on ``triton`` compiled by inductor (``fullgraph=True``): the custom op stays one
    opaque call in inductor's generated code (the path that crashed on an H200 when inductor
    compiled the kernels itself), values and gradients equal to eager to float rounding."""
    torch._dynamo.reset()
    loss = FastAPLoss(num_bins=10, backend="triton")
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(16, 6, generator=gen), torch.arange(16) % 4
    compiled = torch.compile(lambda e, t: loss(e, t), fullgraph=True, backend="inductor")
    (value, grad), codes = run_and_get_code(_value_and_grad, compiled, x, y)
    expected_value, expected_grad = _value_and_grad(lambda e, t: loss(e, t), x, y)
    value_error = float((value - expected_value).abs())
    grad_error = float((grad - expected_grad).abs().max() / expected_grad.abs().max())
    # Forward and backward programs, each calling its operator by name.
    calls = [sum("pml_rank.triton_pair_histograms" + tail in code for code in codes)
             for tail in (".default", "_backward.default")]  # fmt: skip
    ok = value_error <= 1e-6 and grad_error <= 1e-5 and all(calls)
    return dict(ok=ok, value_error=value_error, grad_error=grad_error, calls=calls)


def cases(inductor: bool = False):
    """(name, thunk) of every interpreter case; each thunk returns a record with ``ok``.
    ``inductor``: the one inductor case instead (C++ compilation: slow, its own process)."""
    if inductor:
        return {"inductor_fastap": _inductor_case}
    out = {name: (lambda op=op, args=args: _opcheck(op, args))
           for name, (op, args) in _opcheck_cases().items()}  # fmt: skip
    out["op_equals_eager_function"] = _op_equals_eager_function
    out["compiled_kernel_labels"] = lambda: _kernel_case(dense=False)
    out["compiled_kernel_dense"] = lambda: _kernel_case(dense=True)
    out.update(_loss_cases())
    return out


def main(inductor: bool = False) -> None:
    """Runs every case (in a process with ``TRITON_INTERPRET=1``); prints one JSON line each."""
    if not triton_kernel.interpreted():
        raise SystemExit("run with TRITON_INTERPRET=1 set before the kernels are imported")
    torch.set_num_threads(1)
    for name, thunk in cases(inductor).items():
        try:
            record = thunk()
        except Exception as exc:  # reported by the test of this case
            record = dict(ok=False, error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        print(json.dumps(dict(case=name, **record)), flush=True)


def _run_in_interpreter(inductor: bool) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = f"from tests.functional.histogram.test_triton_ops import main; main({inductor})"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {record["case"]: record for record in records}


@pytest.fixture(scope="module")
def interpreter_results():
    return _run_in_interpreter(inductor=False)


@needs_triton
@pytest.mark.parametrize("case", list(cases()))
def test_in_interpreter(interpreter_results, case):
    record = interpreter_results[case]
    assert record["ok"], record


@needs_triton
@pytest.mark.slow
def test_inductor_keeps_the_custom_op_opaque():
    (record,) = _run_in_interpreter(inductor=True).values()
    assert record["ok"], record


# ---- In-process: the schema, the fake implementations and the tile encoding. ----


def test_schema_takes_optional_label_tensors():
    schema = str(torch.ops.pml_rank.triton_pair_histograms.default._schema)
    for argument in ("Tensor? labels", "Tensor? ref_labels", "Tensor? self_columns",
                     "Tensor? categories", "int[] tiles", "str precision"):  # fmt: skip
        assert argument in schema, schema
    backward = str(torch.ops.pml_rank.triton_pair_histograms_backward.default._schema)
    assert "bool of_queries" in backward and backward.endswith("-> Tensor"), backward


@pytest.mark.parametrize("dense", [False, True], ids=["labels", "dense"])
def test_fake_implementations_give_shapes_and_dtypes(dense):
    """Meta tensors reach the fake implementations (what ``torch.compile`` traces with): the
    histograms ``(N, 2, L + 1)`` and the gradients ``(N, d)`` / ``(M, d)``, float32."""
    meta = [t.to("meta") for t in _inputs(n=5, m=8, d=3)]
    q, r, labels, ref_labels, categories = meta
    source = (None, None, None, categories) if dense else (labels, ref_labels, None, None)
    sizes, precision = DEFAULT_TILES.encode()
    hist = triton_ops.histograms_op(q, r, *source, 5.0, -5.0, 12, sizes, precision)
    assert (hist.shape, hist.dtype, hist.device.type) == ((5, 2, 13), torch.float32, "meta")
    slope = torch.empty(5, 2, 13, device="meta")
    for of_queries, shape in ((True, (5, 3)), (False, (8, 3))):
        grad = triton_ops.gradient_op(slope, q, r, *source, 5.0, -5.0, 12, sizes, precision,
                                      of_queries)  # fmt: skip
        assert (grad.shape, grad.dtype) == (shape, torch.float32)
