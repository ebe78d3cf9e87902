"""``utils.DistributedLossWrapper(loss)(embeddings, indices_tuple=..., ref_emb=...)`` without
labels, as PML's own distributed test calls PML's wrapper (issue 50, item 6), under 2 gloo
processes: the value and gradient equal one process on the concatenated batch (float64), and
equal the same call with the labels given.

One spawned pair of ranks computes every case (processes are the expensive part).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.miners import PairMarginMiner

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss
from pml_rank_plugins.utils import DistributedLossWrapper, DistributedMinerWrapper
from tests.ports import free_port
from tests.spawn import spawn_two, torn_down

N, D, CLASSES, SPLIT = 12, 5, 3, (7, 5)  # uneven shards
TOL = 1e-10
CASES = [(efficient, ref) for efficient in (False, True) for ref in (False, True)]


def _miner() -> PairMarginMiner:
    return PairMarginMiner(pos_margin=0.5, neg_margin=0.5)  # PML's test's miner and margins


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "emb": torch.randn(N, D, generator=gen, dtype=torch.float64),
        "labels": torch.randperm(N, generator=gen) % CLASSES,
        "ref": torch.randn(N, D, generator=gen, dtype=torch.float64),
        "ref_labels": torch.randperm(N, generator=gen) % CLASSES,
    }


def _rows(rank: int) -> slice:
    start = sum(SPLIT[:rank])
    return slice(start, start + SPLIT[rank])


def _single(ref: bool) -> tuple[float, torch.Tensor]:
    """One process: the miner's pairs of the whole batch, the loss given no labels."""
    b = _batch()
    emb = b["emb"].clone().requires_grad_(True)
    loss_fn = ContrastiveLoss()
    if ref:
        pairs = _miner()(emb, b["labels"], b["ref"], b["ref_labels"])
        loss = loss_fn(emb, None, pairs, b["ref"], None)
    else:
        loss = loss_fn(emb, None, _miner()(emb, b["labels"]))
    loss.backward()
    return loss.item(), emb.grad


def _ranked(rank: int, efficient: bool, ref: bool, pass_labels: bool) -> tuple[float, torch.Tensor]:
    b, rows = _batch(), _rows(rank)
    emb = b["emb"][rows].clone().requires_grad_(True)
    labels = b["labels"][rows]
    ref_emb = b["ref"][rows] if ref else None
    ref_labels = b["ref_labels"][rows] if ref else None
    wrapper = DistributedLossWrapper(ContrastiveLoss(), efficient=efficient)
    pairs = DistributedMinerWrapper(_miner(), efficient=efficient)(emb, labels, ref_emb, ref_labels)
    if pass_labels:
        loss = wrapper(emb, labels, pairs, ref_emb, ref_labels)
    else:  # PML's test: loss_fn(outputs, indices_tuple=indices_tuple, ref_emb=ref_outputs)
        loss = wrapper(emb, indices_tuple=pairs, ref_emb=ref_emb)
    loss.backward()
    return loss.item(), emb.grad / dist.get_world_size()  # DDP averages over the ranks


def _refusals(rank: int) -> list[str]:
    """What still needs labels under a process group: the messages."""
    emb = _batch()["emb"][_rows(rank)]
    calls = [
        lambda: DistributedLossWrapper(ContrastiveLoss())(emb),  # no labels, no tuples
        lambda: DistributedLossWrapper(CrossBatchMemory(FastAPLoss(), embedding_size=D))(emb),
    ]
    out = []
    for call in calls:
        try:
            call()
            out.append("no error")
        except ValueError as err:
            out.append(str(err))
    return out


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = {
            (efficient, ref, pass_labels): _ranked(rank, efficient, ref, pass_labels)
            for efficient, ref in CASES
            for pass_labels in (False, True)
        }
        results["refusals"] = _refusals(rank)
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()
    torn_down(out, rank)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = str(tmp_path_factory.mktemp("distributed_unlabeled") / "results")
    spawn_two(_worker, (free_port(), out), out)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]


@pytest.mark.slow  # two spawned processes (a few seconds of CPU), like the other wrapper tests
@pytest.mark.parametrize("efficient, ref", CASES, ids=["full", "full-ref", "efficient", "eff-ref"])
def test_labels_none_with_an_indices_tuple_equals_one_process(ranks, efficient, ref):
    want_value, want_grad = _single(ref)
    assert want_value > 0 and want_grad.abs().sum() > 0  # the miner found pairs with a loss
    for pass_labels in (False, True):
        got = [r[efficient, ref, pass_labels] for r in ranks]
        for value, _ in got:
            assert abs(value - want_value) <= TOL, (pass_labels, value, want_value)
        grad = torch.cat([g for _, g in got])
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=TOL)


@pytest.mark.slow
def test_labels_are_still_required_without_tuples_and_for_a_memory(ranks):
    for r in ranks:
        no_tuples, memory = r["refusals"]
        assert no_tuples == "labels are required (or pass an indices_tuple)"
        assert memory == "labels are required (CrossBatchMemory stores them)"
