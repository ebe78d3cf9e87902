"""Compile time and step time of our losses under ``torch.compile``, against eager, in one run.

For each loss of ``--losses`` (FastAP 10 bins, RankedList) on each backend of ``--backends``
(the loss's ``backend=``) and each ``torch.compile`` backend of ``--compilers`` (``aot_eager``:
Dynamo + AOT autograd; ``inductor``: generated C++ / Triton code), on fixed embeddings
(``--n`` x ``--dim``, 4 per class) and one forward + backward per step:

* ``compile s``: the first compiled call's seconds as Dynamo counts them (frame compilation,
  the backend and the lazily compiled backward; ``torch._dynamo.reset()`` before each case, so
  nothing is reused), and the graphs and graph breaks it made;
* ``eager ms`` / ``compiled ms``: median milliseconds of a step after ``--warmup`` untimed
  steps, the two timed alternately in ``--rounds`` rounds (best round kept), so a load that comes
  and goes slows both alike; ``eager / compiled`` above 1 means the compiled step is faster;
* ``max |d value|`` / ``max |d grad|``: the compiled step against the eager one on the same
  inputs (a silently wrong compiled loss shows here, not only in the timing).

On CUDA (``--device cuda``) ``--mode reduce-overhead`` captures the compiled step in CUDA graphs
(``torch.compiler.cudagraph_mark_step_begin()`` before each step) and steps are timed with CUDA
events' host-synchronised wall time. One torch thread on the CPU (the cost of one driving
thread, as ``bench_host_overhead.py``).

Run: ``python benchmarks/bench_compile.py [--n 256] [--dim 32] [--losses FastAP,RankedList]
[--backends cpu,gpu] [--compilers aot_eager,inductor] [--device cpu|cuda] [--mode MODE]
[--repeats 20] [--rounds 3] [--warmup 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from pml_rank_plugins.losses import FastAPLoss, RankedListLoss
from pml_rank_plugins.running.compiled import compile_totals

LOSSES = ("FastAP", "RankedList")


def names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def make_loss(name: str, backend: str) -> torch.nn.Module:
    if name == "FastAP":
        return FastAPLoss(num_bins=10, backend=backend)
    if name == "RankedList":
        return RankedListLoss(margin=0.4, alpha=1.2, Tn=10.0, backend=backend)
    raise SystemExit(f"bench_compile.py: --losses: unknown loss {name!r}; one of {LOSSES}")


def inputs(n: int, dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=generator).to(device)
    return x, (torch.arange(n) // 4).to(device)


def one_step(fn, x: torch.Tensor, labels: torch.Tensor, cuda_graphs: bool):
    """``(value, gradient, seconds)`` of one forward + backward on a fresh leaf copy of ``x``."""
    leaf = x.detach().clone().requires_grad_(True)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    if cuda_graphs:
        torch.compiler.cudagraph_mark_step_begin()
    value = fn(leaf, labels)
    value.backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    took = time.perf_counter() - start
    return value.detach().clone(), leaf.grad.clone(), took


def median_ms(fn, x, labels, repeats: int, cuda_graphs: bool) -> float:
    return statistics.median(one_step(fn, x, labels, cuda_graphs)[2] for _ in range(repeats)) * 1e3


def run_case(args, name: str, backend: str, compiler: str) -> dict:
    """One row: compile the step of ``name`` on ``backend`` with ``compiler`` and time it."""
    x, labels = inputs(args.n, args.dim, args.device)
    loss = make_loss(name, backend)
    torch._dynamo.reset()
    kwargs = {"backend": compiler}
    if args.mode is not None:
        kwargs["mode"] = args.mode
    compiled = torch.compile(lambda emb, lab: loss(emb, lab), **kwargs)
    graphs = args.device == "cuda" and args.mode in ("reduce-overhead", "max-autotune")
    before = compile_totals()
    got = one_step(compiled, x, labels, graphs)  # the first call compiles
    spent = {k: v - before[k] for k, v in compile_totals().items()}
    want = one_step(loss, x, labels, False)
    row = {"loss": name, "backend": backend, "compiler": compiler, "mode": args.mode or "-"}
    row.update(compile_s=spent["seconds"], first_call_s=got[2])
    row.update(graphs=int(spent["graphs"]), graph_breaks=int(spent["graph_breaks"]))
    row["d_value"] = float((got[0] - want[0]).abs().max())
    row["d_grad"] = float((got[1] - want[1]).abs().max())
    for _ in range(args.warmup):
        one_step(loss, x, labels, False), one_step(compiled, x, labels, graphs)
    eager, fast = [], []
    for _ in range(args.rounds):  # alternate: a passing load slows both
        eager.append(median_ms(loss, x, labels, args.repeats, False))
        fast.append(median_ms(compiled, x, labels, args.repeats, graphs))
    row.update(eager_ms=min(eager), compiled_ms=min(fast))
    row["eager_over_compiled"] = row["eager_ms"] / row["compiled_ms"]
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="embeddings per step (default 256)")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--losses", type=names, default=list(LOSSES), help="FastAP,RankedList")
    parser.add_argument("--backends", type=names, default=["cpu", "gpu"], help="e.g. cpu,gpu")
    parser.add_argument(
        "--compilers", type=names, default=["aot_eager", "inductor"], help="torch.compile backends"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mode", default=None, help="inductor mode, e.g. reduce-overhead")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (best kept)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    return parser.parse_args(argv)


def header(args) -> str:
    where = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    return (
        f"torch.compile vs eager, one forward + backward, N={args.n}, d={args.dim}, float32, "
        f"{args.device} ({where or platform.machine()}), torch {torch.__version__}, medians of "
        f"{args.repeats} steps, best of {args.rounds} rounds"
    )


def main(argv: list[str] | None = None) -> int:
    """Measures every case, prints the Markdown table; returns 0."""
    args = parse_args(argv)
    if min(args.n, args.dim, args.repeats, args.rounds) < 1 or args.warmup < 0:
        raise SystemExit("bench_compile.py: --n, --dim, --repeats, --rounds >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_compile.py: --device cuda, but no CUDA GPU is available")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [
            run_case(args, name, backend, compiler)
            for name in args.losses
            for backend in args.backends
            for compiler in args.compilers
        ]
    finally:
        torch.set_num_threads(threads)
    print(header(args))
    print(
        "| loss | backend | compiler | compile s | graphs | breaks | eager ms | compiled ms "
        "| eager / compiled | max abs d value | max abs d grad |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [r["loss"], r["backend"], r["compiler"], f"{r['compile_s']:.1f}", r["graphs"]]
        cells += [r["graph_breaks"], f"{r['eager_ms']:.2f}", f"{r['compiled_ms']:.2f}"]
        cells += [f"{r['eager_over_compiled']:.2f}x", f"{r['d_value']:.1e}", f"{r['d_grad']:.1e}"]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    if args.json:
        settings = {k: getattr(args, k) for k in ("n", "dim", "device", "mode", "repeats")}
        Path(args.json).write_text(json.dumps({**settings, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
