"""Training-step time with a real trunk, and the metric loss's share of it (issue 39).

A torchvision ResNet (``--arch resnet50``, random weights: ``weights=None``) whose ``fc`` is an
embedding head ``Linear(features, --embedding-dim)``, on synthetic images (``--batch`` random
``3 x --image-size x --image-size`` tensors made once on the device, labels 4 per class), trained
with Adam. One step = ``zero_grad``, the trunk's forward under ``torch.autocast(--autocast)``
(``auto``: bfloat16 on CUDA, as users train on GPUs; float32 on the CPU), the loss,
``backward``, ``optimizer.step()``. The same model serves every case (its weights drift; the
time does not depend on them). Cases:

* ``fastap`` / ``rll`` -- ``pml_rank_plugins.losses.FastAPLoss(num_bins=10)`` /
  ``RankedListLoss(margin=0.4, alpha=1.2, Tn=10)``, under each backend of ``--backends``
  (``use_backend``; default ``auto``: ``gpu`` on CUDA, ``cpu`` on the CPU);
* ``pml_fastap`` / ``pml_rll`` / ``pml_contrastive`` -- PML's ``FastAPLoss(num_bins=10)``,
  ``RankedListLoss(margin=0.4, Tn=10, imbalance=0.5, alpha=1.2)``, ``ContrastiveLoss()``;
* ``trunk`` -- the step with ``embeddings.float().square().mean()`` as the loss: the trunk's own
  cost, so ``step - trunk`` is what a metric loss adds.

Per case: ``--warmup`` untimed steps, then ``--steps`` timed steps (median; CUDA: CUDA events
around each step, ``torch.cuda.synchronize`` after it), and the loss alone timed on the last
step's embeddings (detached, same dtype, the forward under the same autocast, then backward):
``loss share = loss time / step time``. Peak: ``torch.cuda.max_memory_allocated`` during the
case's steps (CUDA only). A case that fails is printed with its traceback and the rest go on;
``--budget-s`` skips the cases that would start after it runs out.

Run: ``python benchmarks/bench_train_step.py [--device auto|cpu|cuda] [--arch resnet50|resnet18]
[--batch 256] [--image-size 224] [--steps 10] [--autocast auto|bfloat16|float16|none]
[--backends auto] [--json PATH]``. CPU smoke size: ``--device cpu --arch resnet18
--image-size 32 --batch 8 --steps 1 --warmup 0``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torchvision
from _backends import backend_context, backend_list
from pytorch_metric_learning import losses as pml_losses

from pml_rank_plugins.losses import FastAPLoss, RankedListLoss

PLUGIN_CASES = {"fastap": "plugin FastAP", "rll": "plugin RankedList"}
PML_CASES = {
    "pml_fastap": "PML FastAPLoss",
    "pml_rll": "PML RankedListLoss",
    "pml_contrastive": "PML ContrastiveLoss",
}
CASES = ["trunk", *PLUGIN_CASES, *PML_CASES]


def make_loss(case: str) -> Callable:
    """The loss of ``case`` as ``f(embeddings, labels) -> scalar``."""
    if case == "trunk":
        return lambda emb, labels: emb.float().square().mean()
    if case == "fastap":
        return FastAPLoss(num_bins=10)
    if case == "rll":
        return RankedListLoss(margin=0.4, alpha=1.2, Tn=10.0)
    if case == "pml_fastap":
        return pml_losses.FastAPLoss(num_bins=10)
    if case == "pml_rll":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PML warns for any Tn > 5
            return pml_losses.RankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2)
    if case == "pml_contrastive":
        return pml_losses.ContrastiveLoss()
    raise ValueError(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def make_model(arch: str, embedding_dim: int, device: torch.device) -> torch.nn.Module:
    """``torchvision.models.<arch>(weights=None)`` with ``fc = Linear(features, embedding_dim)``."""
    model = getattr(torchvision.models, arch)(weights=None)
    model.fc = torch.nn.Linear(model.fc.in_features, embedding_dim)
    return model.to(device).train()


class Timer:
    """Times ``fn()``: CUDA events and a synchronize on CUDA, ``perf_counter`` elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3


def autocast_context(device: torch.device, autocast: str):
    """``torch.autocast(device.type, dtype)``, or nothing for ``"none"``."""
    if autocast == "none":
        return nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, autocast))


def run_case(case: str, backend: str | None, model, images, labels, args) -> dict:
    """Steps and loss-alone timings of one case: ``{"step_s", "loss_s", "share", "peak"}``."""
    device = images.device
    loss_fn, timer = make_loss(case), Timer(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    last = {}

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(device, args.autocast):
            embeddings = model(images)
            loss = loss_fn(embeddings, labels)
        loss.backward()
        optimizer.step()
        last["embeddings"] = embeddings.detach()

    def loss_alone():
        emb = last["embeddings"].clone().requires_grad_(True)
        with autocast_context(device, args.autocast):
            loss = loss_fn(emb, labels)
        loss.backward()

    with backend_context(backend):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.warmup):
            step()
        step_times = [timer(step) for _ in range(args.steps)]
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
        loss_alone()  # warm-up of the loss on its own
        loss_times = [timer(loss_alone) for _ in range(max(args.steps, 3))]
    step_s, loss_s = statistics.median(step_times), statistics.median(loss_times)
    return {"step_s": step_s, "loss_s": loss_s, "share": loss_s / step_s, "peak": peak}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--arch", choices=["resnet50", "resnet18"], default="resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per case (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per case first")
    parser.add_argument(
        "--autocast",
        choices=["auto", "bfloat16", "float16", "none"],
        default="auto",
        help="the forward's autocast dtype (auto: bfloat16 on CUDA, none on the CPU, where "
        "bfloat16 is emulated and about 10x slower)",
    )
    parser.add_argument(
        "--backends",
        type=backend_list,
        default=["auto"],
        help="backends for the plugin losses (comma-separated: cpu,gpu,triton,auto)",
    )
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}"
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch)")
    parser.add_argument("--budget-s", type=float, default=None, help="skip cases after S s")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but no CUDA GPU is available (use --device cpu or auto)")
    if args.autocast == "auto":
        args.autocast = "bfloat16" if args.device == "cuda" else "none"
    return args


def planned(args) -> list[tuple[str, str | None]]:
    """``(case, backend)`` pairs: plugin cases once per backend, the others once."""
    return [
        (case, backend)
        for case in args.cases
        for backend in (args.backends if case in PLUGIN_CASES else [None])
    ]


def main(argv: list[str] | None = None) -> int:
    """Measures every case, prints the table (and the failures with their tracebacks)."""
    args = parse_args(argv)
    start = time.monotonic()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = make_model(args.arch, args.embedding_dim, device)
    size = args.image_size
    images = torch.randn(args.batch, 3, size, size, device=device)
    labels = (torch.arange(args.batch) // 4).to(device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(
        f"Training step: {args.arch} (random init) + Linear -> {args.embedding_dim}, batch "
        f"{args.batch}, {size} px synthetic images, autocast {args.autocast}, Adam, {where}, "
        f"torch {torch.__version__}; median of {args.steps} step(s) after {args.warmup} "
        "warm-up; loss = the loss's forward + backward alone on the step's embeddings",
        flush=True,
    )
    print("| case | backend | step ms | loss ms | loss share | step - trunk ms | peak GiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |", flush=True)
    results, failures = [], []
    trunk_s = None
    for case, backend in planned(args):
        label = PLUGIN_CASES.get(case) or PML_CASES.get(case) or "trunk only"
        record = {"case": case, "label": label, "backend": backend}
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            record["skipped"] = "out of the time budget (--budget-s)"
            failures.append(f"{label} ({backend or '-'}): skipped: {record['skipped']}")
        else:
            try:
                record.update(run_case(case, backend, model, images, labels, args))
            except Exception as e:  # noqa: BLE001 -- printed below, the next case runs
                record["error"] = f"{type(e).__name__}: {e}"
                failures.append(f"{label} ({backend or '-'}):\n```\n{traceback.format_exc()}```")
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if case == "trunk" and "step_s" in record:
            trunk_s = record["step_s"]
        results.append(record)
        print_row(record, trunk_s)
    for failure in failures:
        print(failure)
    if args.json:
        payload = {key: value for key, value in vars(args).items() if key != "json"}
        payload.update(device_name=where, torch=torch.__version__, results=results)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


def print_row(record: dict, trunk_s: float | None) -> None:
    """One Markdown row (``skipped`` / ``error`` cells for a case not measured)."""
    if "step_s" not in record:
        status = "skipped" if "skipped" in record else "error"
        cells = [status] * 4 + ["-"]
    else:
        step_s, peak = record["step_s"], record["peak"]
        extra = (
            "-"
            if trunk_s is None or record["case"] == "trunk"
            else f"{(step_s - trunk_s) * 1e3:.1f}"
        )
        cells = [
            f"{step_s * 1e3:.1f}",
            f"{record['loss_s'] * 1e3:.2f}",
            f"{100 * record['share']:.1f}%",
            extra,
            "-" if peak is None else f"{peak / 2**30:.1f}",
        ]
    row = [record["label"], record["backend"] or "-", *cells]
    print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
