"""The fused Triton soft-histogram kernel (``functional/histogram/triton_kernel.py``) on a GPU:
correctness against the torch kernel, determinism, and forward+backward time per tile setting.

1. Correctness: labels, self columns, dense categories with ignored pairs, ``refs is queries``,
   at several ``L`` (N = 300, M = 257, d = 100): the largest histogram difference and the largest
   gradient difference (relative to the largest gradient entry) against ``pair_histograms`` in
   float64 on the same inputs.
2. Determinism: two runs of forward+backward compared bit for bit.
3. Time (CUDA events, median of ``--repeats`` after warm-up) of forward+backward of
   ``sum(w * h)``, self-ranking with labels (4 items per class, the diagonal ignored), d = 128,
   L = 10, for each ``--sizes`` N: the torch kernel (``pair_histograms``, cpu backend code on
   the GPU), the floor (``S = X X^T; (S * S).sum().backward()``) and the Triton kernel for each
   tile setting of ``SETTINGS`` (first call's compile time printed).

Usage: ``python benchmarks/bench_histogram_triton.py [--sizes 1024 4096 16384] [--repeats 10]``
(``--device cpu`` with ``TRITON_INTERPRET=1`` set runs a tiny smoke version on CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pml_rank_plugins.functional.histogram import triton_kernel as tk
from pml_rank_plugins.functional.histogram.cpu import LabelCategories, pair_histograms

SETTINGS = {
    "default": tk.DEFAULT_TILES,
    "ieee": tk.Tiles(precision="ieee"),
    "k64": tk.Tiles(block_k=64),
    "n32_m32": tk.Tiles(block_n=32, block_m=32),
    "m32": tk.Tiles(block_m=32),
    "w8": tk.Tiles(num_warps=8),
    "stages3": tk.Tiles(num_stages=3),
    "sm2": tk.Tiles(programs_per_sm=2),
    "sm8": tk.Tiles(programs_per_sm=8),
}


def unit(n, d, gen, device):
    x = torch.randn(n, d, generator=gen, device="cpu")
    return torch.nn.functional.normalize(x, dim=1).to(device)


def correctness(device, tiles, n=300, m=257, d=100) -> None:
    gen = torch.Generator().manual_seed(0)
    q, r = unit(n, d, gen, device), unit(m, d, gen, device)
    labels = torch.randint(0, 30, (n,), generator=gen).to(device)
    ref_labels = torch.randint(0, 30, (m,), generator=gen).to(device)
    dense = torch.randint(0, 3, (n, m), generator=gen, dtype=torch.int8).to(device)
    dense[7] = 2
    self_columns = torch.randint(0, m, (n,), generator=gen).to(device)
    print("## correctness (float32 kernel vs float64 torch kernel)")
    for name, L, kw, same in [
        ("labels", 10, dict(labels=labels, ref_labels=ref_labels), False),
        ("self_columns", 19, dict(labels=labels, ref_labels=ref_labels, self=self_columns), False),
        ("dense", 50, dict(categories=dense), False),
        ("dense", 127, dict(categories=dense), False),
        ("queries_are_refs", 10, dict(labels=labels, ref_labels=labels, self="diag"), True),
    ]:
        self_cols = kw.get("self")
        if isinstance(self_cols, str):
            self_cols = torch.arange(n, device=device)
        if "categories" in kw:
            source = kw["categories"]
        else:
            source = LabelCategories(kw["labels"], kw["ref_labels"], self_cols)
        w = torch.randn(n, 2, L + 1, generator=gen).to(device)
        out = []
        for dtype in (torch.float32, torch.float64):
            qq = q.to(dtype).requires_grad_()
            rr = qq if same else r.to(dtype).requires_grad_()
            start = time.perf_counter()
            if dtype == torch.float32:
                h = tk.triton_pair_histograms(
                    qq, rr, kw.get("labels"), kw.get("ref_labels"), self_cols, L / 2, -L / 2, L,
                    categories=kw.get("categories"), tiles=tiles,
                )  # fmt: skip
            else:
                h = pair_histograms(qq, rr, source, L / 2, -L / 2, L)
            grads = torch.autograd.grad((h * w.to(dtype)).sum(), [qq] if same else [qq, rr])
            torch.cuda.synchronize() if device == "cuda" else None
            seconds = time.perf_counter() - start
            out.append((h.detach().double(), [g.double() for g in grads], seconds))
        (h, g, seconds), (h64, g64, _) = out
        value = float((h - h64).abs().max())
        grad = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g, g64))
        print(f"{name:18s} L={L:3d}: max |dh| {value:.2e}, max |dgrad|/max|grad| {grad:.2e}, "
              f"first call (compile) {seconds:.1f} s")  # fmt: skip


def self_ranking_inputs(n, d, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = unit(n, d, gen, device)
    labels = (torch.arange(n) // 4).to(device)
    return x, labels


def timed(fn, repeats, device) -> float:
    """Median milliseconds of ``fn()`` after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def bench(n, d, L, repeats, device) -> None:
    x, labels = self_ranking_inputs(n, d, device)
    diag = torch.arange(n, device=device)
    w = torch.randn(n, 2, L + 1, device=device)

    def run_triton(tiles):
        def fn():
            xx = x.detach().requires_grad_()
            h = tk.triton_pair_histograms(xx, xx, labels, labels, diag, L / 2, -L / 2, L,
                                          tiles=tiles)  # fmt: skip
            (h * w).sum().backward()
            return h, xx.grad

        return fn

    def run_torch():
        xx = x.detach().requires_grad_()
        h = pair_histograms(xx, xx, LabelCategories(labels, labels, diag), L / 2, -L / 2, L)
        (h * w).sum().backward()

    def run_floor():
        xx = x.detach().requires_grad_()
        s = xx @ xx.T
        (s * s).sum().backward()

    try:
        floor = timed(run_floor, repeats, device)
    except torch.OutOfMemoryError:  # the floor materialises N x N: too big at the largest N
        floor = float("nan")
    torch.cuda.empty_cache() if device == "cuda" else None
    rows = [("floor", floor, "")]
    if n <= 16384:
        rows.append(("torch kernel", timed(run_torch, repeats, device), ""))
    for name, tiles in SETTINGS.items():
        fn = run_triton(tiles)
        start = time.perf_counter()
        try:
            h1, g1 = fn()
        except Exception as exc:  # a setting that does not compile is reported, not fatal
            rows.append((f"triton {name}", float("nan"), f"{type(exc).__name__}: {exc}"[:120]))
            continue
        compile_s = time.perf_counter() - start
        h2, g2 = fn()
        same = bool(torch.equal(h1, h2) and torch.equal(g1, g2))
        note = f"first call {compile_s:.1f} s, bitwise repeatable {same}"
        rows.append((f"triton {name}", timed(fn, repeats, device), note))
    print(f"\n## N = {n}, d = {d}, L = {L} (forward + backward, median ms)")
    for name, ms, note in rows:
        print(f"{name:18s} {ms:9.3f} ms  {ms / floor:6.2f}x floor  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args()
    if args.device == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton",
              tk.triton.__version__)  # fmt: skip
    small = tk.Tiles(block_n=16, block_m=16, block_k=16, block_d=16, target_programs=8)
    if not args.skip_correctness:
        if args.device == "cuda":
            for precision in ("ieee", "tf32x3"):
                print(f"# tl.dot input_precision {precision}")
                correctness(args.device, tk.Tiles(precision=precision))
        else:  # the interpreter: tiny sizes
            correctness(args.device, small, n=20, m=17, d=20)
    for n in args.sizes:
        bench(n, 128, args.bins, args.repeats, args.device)


if __name__ == "__main__":
    main()
