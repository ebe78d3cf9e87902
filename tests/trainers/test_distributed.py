"""Two gloo processes on loopback: chunked DDP gradients equal the single-process global batch."""

import importlib

import pytest
import torch
import torch.distributed as dist
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.trainers import _dist, chunked_backward, distributed
from pml_rank_plugins.trainers.distributed import is_initialized, rank, world_size
from tests.ports import free_port
from tests.spawn import spawn_two, torn_down

SHARDS = [slice(0, 14), slice(14, 26)]  # uneven on purpose


def make_problem():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(26, 6, generator=gen, dtype=torch.float64)
    y = torch.arange(26) % 5
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    torch.manual_seed(2)
    proxies = ProxyAnchorLoss(5, 8)
    return x, y, model.double(), proxies.double()


def combined_loss(proxies):
    fastap = FastAPLoss()
    return lambda emb, labels, _: fastap(emb, labels) + proxies(emb, labels)


def worker(process, port, out_path):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=process, world_size=2
    )
    try:
        x, y, model, proxies = make_problem()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        shard = SHARDS[process]
        chunked_backward(ddp, x[shard], y[shard], combined_loss(proxies), chunk_size=4)
        grads = [p.grad for p in model.parameters()] + [p.grad for p in proxies.parameters()]
        torch.save(grads, f"{out_path}.{process}")
        torch.save((world_size(), rank(), is_initialized()), f"{out_path}.{process}.dist")
    finally:
        dist.destroy_process_group()
    torn_down(out_path, process)


@pytest.mark.slow
def test_two_rank_gloo_gradients_equal_single_process(tmp_path):
    out = str(tmp_path / "grads")
    spawn_two(worker, (free_port(), out), out)
    x, y, model, proxies = make_problem()
    loss = combined_loss(proxies)(model(x), y, None)
    loss.backward()
    # the ranks ran on the CPU (new processes); the reference on the test device
    want = [p.grad.cpu() for p in [*model.parameters(), *proxies.parameters()]]
    for process in range(2):
        assert torch.load(f"{out}.{process}.dist") == (2, process, True)
        got = torch.load(f"{out}.{process}")
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_one_world_size_helper_single_process():
    assert not dist.is_initialized()
    assert (world_size(), rank(), is_initialized()) == (1, 0, False)
    # one definition, used by both trainer modules (the package's ``chunked_backward`` name is
    # the function, so the module is looked up by its full name)
    chunked_module = importlib.import_module("pml_rank_plugins.trainers.chunked_backward")
    assert distributed.world_size is _dist.world_size is chunked_module.world_size
    assert distributed.rank is _dist.rank is chunked_module.rank
    assert distributed.is_initialized is _dist.is_initialized
    assert not hasattr(chunked_module, "_world_size")
