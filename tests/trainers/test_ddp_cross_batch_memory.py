"""CrossBatchMemory under 2 gloo processes: every rank enqueues the gathered global batch in rank
order, so the memory is identical on both ranks and equal to the 1-process run's (PML #639)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from pytorch_metric_learning.losses import ContrastiveLoss

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss
from pml_rank_plugins.trainers import DistributedMetricLossOnly, wrap_ddp
from tests.ports import free_port
from tests.spawn import spawn_two, torn_down

STEPS, BATCH, MEMORY = 5, 10, 24  # the queue wraps around (50 items through 24 slots)


def _train(loss_name: str) -> dict:
    """``STEPS`` steps of ``DistributedMetricLossOnly``; returns the memory and the weights."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=gen, dtype=torch.float64)
    y = torch.arange(40) % 5
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8))
    model = model.double()
    inner = FastAPLoss() if loss_name == "fastap" else ContrastiveLoss()
    memory = CrossBatchMemory(inner, embedding_size=8, memory_size=MEMORY)
    trainer = DistributedMetricLossOnly(
        models=wrap_ddp({"trunk": model}, torch.device("cpu")),
        optimizers={"trunk_optimizer": torch.optim.SGD(model.parameters(), lr=0.5)},
        batch_size=BATCH,
        loss_funcs={"metric_loss": memory},
        mining_funcs={},
        dataset=torch.utils.data.TensorDataset(x, y),
        iterations_per_epoch=STEPS,
        dataloader_num_workers=0,
        data_device=torch.device("cpu"),
    )
    trainer.train(1, 1)
    return {
        "embedding_memory": memory.embedding_memory.clone(),
        "label_memory": memory.label_memory.clone(),
        "queue_idx": memory.queue_idx,
        "has_been_filled": memory.has_been_filled,
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.save({name: _train(name) for name in ("contrastive", "fastap")}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()
    torn_down(out, rank)


@pytest.mark.slow  # two spawned processes (about 10 s of CPU)
def test_memory_identical_on_both_ranks_and_equal_to_one_process(tmp_path):
    out = str(tmp_path / "memory")
    spawn_two(_worker, (free_port(), out), out)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for name in ("contrastive", "fastap"):
        r0, r1 = ranks[0][name], ranks[1][name]
        single = _train(name)
        assert r0["has_been_filled"] and r0["queue_idx"] == (STEPS * BATCH) % MEMORY
        # identical on both ranks: same values, same slots, same queue position
        assert torch.equal(r0["embedding_memory"], r1["embedding_memory"]), name
        assert torch.equal(r0["label_memory"], r1["label_memory"]), name
        assert (r0["queue_idx"], r0["has_been_filled"]) == (r1["queue_idx"], r1["has_been_filled"])
        # and what one process holds after the same global batches
        assert torch.equal(r0["label_memory"], single["label_memory"]), name
        torch.testing.assert_close(r0["embedding_memory"], single["embedding_memory"])
        for key, want in single["weights"].items():
            torch.testing.assert_close(r0["weights"][key], want, rtol=1e-9, atol=1e-12)
        assert single["embedding_memory"].abs().sum(dim=1).gt(0).all()  # every slot written
