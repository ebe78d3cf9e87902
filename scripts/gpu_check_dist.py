"""The ``distributed`` part of ``scripts/gpu_check.py``: two processes on the one device.

``python scripts/gpu_check_dist.py distributed --device cuda|cpu --out DIR`` starts ``torchrun
--nproc_per_node=2`` on this script's ``ddp-worker`` (static rendezvous on a free port, as
docs/scaling.md's commands do). Each rank computes the gradient of its slice of a 26-item
global batch through ``DistributedDataParallel`` and the package's ``chunked_backward``
(FastAP + PML's ProxyAnchor, float64, as ``tests/trainers/test_distributed.py``); the part
compares both ranks' gradients with one process on the whole batch (process-group timeout
:data:`EQUALITY_TIMEOUT_S`: generous, CUDA start-up in a second rank is slow). Then, in a new
process group with the short timeout :data:`TIMEOUT_S`, rank 1 hangs and rank 0's barrier must
fail with :class:`~pml_rank_plugins.running.distributed.RankTimeoutError` naming rank 1.

Layouts (:func:`ddp_layout`): on the CPU gloo through ``distributed.setup``; on two or more GPUs
NCCL through ``distributed.setup`` (``cuda:LOCAL_RANK``; NCCL's watchdog aborts a rank on the
timeout, so only a non-zero exit is required there); on one GPU gloo with both ranks' tensors on
``cuda:0`` -- ``distributed.setup`` refuses more ranks than GPUs (checked here too) and NCCL
refuses two ranks on one GPU.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gpu_check_parts import done, fail, part_main, part_parser, run, tail
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.running import distributed
from pml_rank_plugins.trainers import chunked_backward

SHARDS = [slice(0, 14), slice(14, 26)]  # uneven on purpose, as tests/trainers/test_distributed.py
# The hang scenario's process-group timeout (short: the part waits it out); NCCL's first collective
# also sets up the communicator. The gradient check runs in a group with EQUALITY_TIMEOUT_S: CUDA
# start-up in a second rank takes longer than the short timeout (2 s failed DDP's start on an H200).
TIMEOUT_S = {"gloo": 5, "nccl": 20}
EQUALITY_TIMEOUT_S = 60
TOLERANCE = 1e-9  # float64 gradients; 1e-10 on the CPU test


def ddp_problem(device: torch.device):
    """float64 inputs, a small MLP, PML proxies and the loss (FastAP + proxies)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(26, 6, generator=gen, dtype=torch.float64)
    y = torch.arange(26) % 5
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    torch.manual_seed(2)
    proxies = ProxyAnchorLoss(5, 8).double().to(device)
    fastap = FastAPLoss()
    loss = lambda emb, labels, _: fastap(emb, labels) + proxies(emb, labels)  # noqa: E731
    return x.to(device), y.to(device), model.double().to(device), proxies, loss


def gradients(model, proxies) -> list[torch.Tensor]:
    return [p.grad.cpu() for p in [*model.parameters(), *proxies.parameters()]]


def ddp_layout(device: str) -> tuple[str, str]:
    """``(backend, layout)``: ``("gloo", "setup")`` on the CPU, ``("nccl", "setup")`` with two or
    more GPUs, ``("gloo", "one-gpu")`` on a single GPU."""
    if device == "cpu":
        return "gloo", "setup"
    return ("nccl", "setup") if torch.cuda.device_count() >= 2 else ("gloo", "one-gpu")


def ddp_worker(args) -> None:
    """One torchrun rank: gradients to ``OUT/grads.RANK.pt`` (process group timeout
    :data:`EQUALITY_TIMEOUT_S`), then the timeout scenario in a new group with the short
    :data:`TIMEOUT_S` (rank 0 writes the error to ``OUT/timeout.txt`` and exits 1)."""
    backend, layout = ddp_layout(args.device)
    setup_device = args.device if layout == "setup" else "cpu"
    ctx = distributed.setup(setup_device, timeout=EQUALITY_TIMEOUT_S)
    device = ctx.device if layout == "setup" else torch.device("cuda", 0)
    rank, out = dist.get_rank(), Path(args.out)
    x, y, model, proxies, loss = ddp_problem(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    chunked_backward(ddp, x[SHARDS[rank]], y[SHARDS[rank]], loss, chunk_size=4)
    torch.save(
        {"grads": gradients(model, proxies), "device": str(device)}, out / f"grads.{rank}.pt"
    )
    distributed.barrier()  # both saved before rank 1 hangs
    del ddp
    # The hang scenario in a new group of the same ranks with the short timeout, on the same
    # rendezvous: tearing the group down and setting it up again failed under load inside the
    # second setup (exit 1 before the barrier, no message; make test, 2 cores, load 6-10).
    seconds = TIMEOUT_S[backend]
    short = dist.new_group(timeout=datetime.timedelta(seconds=seconds))
    distributed._timeout_s = seconds  # the RankTimeoutError names this group's timeout
    if rank == 1:
        time.sleep(300)  # hung: torchrun stops it once rank 0 has exited
    try:
        with distributed.named_timeouts():
            dist.barrier(group=short)
    except distributed.RankTimeoutError as e:
        (out / "timeout.txt").write_text(str(e))
        sys.exit(1)
    sys.exit("rank 0: the barrier returned although rank 1 never reached it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_gpu_refusal() -> str | None:
    """On one GPU, ``distributed.setup("cuda")`` as rank 1 of 2 must refuse, naming LOCAL_RANK
    (it raises before any process group is made). ``None`` when it does."""
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    saved = {key: os.environ.get(key) for key in [*env, "MASTER_PORT"]}
    os.environ.update(env, MASTER_PORT="1")
    try:
        distributed.setup("cuda", timeout=2)
        return "setup('cuda') accepted rank 1 of 2 on a single GPU"
    except RuntimeError as e:
        return None if "LOCAL_RANK=1 but only 1 GPUs" in str(e) else f"unexpected error: {e}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def compare_gradients(args, details: dict) -> float:
    """Largest difference between either rank's gradients and one process's."""
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    x, y, model, proxies, loss = ddp_problem(device)
    loss(model(x), y, None).backward()
    want = gradients(model, proxies)
    worst = 0.0
    for rank in range(2):
        got = torch.load(Path(args.out, f"grads.{rank}.pt"))
        details[f"rank{rank}_device"] = got["device"]
        worst = max([worst, *((g - w).abs().max().item() for g, w in zip(got["grads"], want))])
    return worst


def part_distributed(args) -> dict:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch.cuda.is_available() is False")
    backend, layout = ddp_layout(args.device)
    details = {
        "backend": backend,
        "layout": layout,
        "timeout_s": TIMEOUT_S[backend],
        "equality_timeout_s": EQUALITY_TIMEOUT_S,
    }
    lines = [f"- backend {backend} ({layout}), 2 processes on {args.device}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    cmd += [f"--master_port={free_port()}", Path(__file__).resolve(), "ddp-worker"]
    cmd += ["--device", args.device, "--out", args.out]
    start = time.monotonic()
    code, output = run(cmd, args.budget)
    seconds = round(time.monotonic() - start, 1)
    Path(args.out, "torchrun.log").write_text(output)
    problems = []
    if not all(Path(args.out, f"grads.{rank}.pt").is_file() for rank in range(2)):
        problems.append(f"2-process gradients not saved: exit code {code}: {tail(output, 5)}")
    else:
        worst = details["max_abs_difference"] = compare_gradients(args, details)
        lines.append(f"- 2 processes vs 1 on the same global batch: max |diff| {worst:.2e}")
        if not worst <= TOLERANCE:
            problems.append(f"2-process gradients differ from 1 process by {worst:.2e}")
    message = Path(args.out, "timeout.txt")
    text = message.read_text() if message.is_file() else ""
    details["timeout"] = {"returncode": code, "seconds": seconds, "message": text}
    lines.append(f"- timeout path (torchrun exit {code} after {seconds} s): {text or '-'}")
    named = f"rank 1 did not answer within the process-group timeout of {TIMEOUT_S[backend]} s"
    if code == 0 or (backend == "gloo" and named not in text):
        problems.append(f"timeout path: exit code {code}, message {text!r}: {tail(output, 3)}")
    if args.device == "cuda" and torch.cuda.device_count() == 1:
        refusal = single_gpu_refusal()
        details["single_gpu_setup"] = refusal or "refused, naming LOCAL_RANK"
        lines.append(f"- setup('cuda') for 2 ranks on 1 GPU: {details['single_gpu_setup']}")
        problems += [refusal] if refusal else []
    if problems:
        return fail("; ".join(problems), details, lines)
    return done("pass", None, details, lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ddp-worker"]:
        ddp_worker(part_parser(["ddp-worker"]).parse_args())
    else:
        part_main({"distributed": part_distributed})
