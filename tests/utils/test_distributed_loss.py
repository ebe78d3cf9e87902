"""``utils.DistributedLossWrapper`` / ``DistributedMinerWrapper`` under 2 gloo processes (issue 41).

ONE spawned pair of ranks computes everything (processes are the expensive part): for every loss,
our wrapper in both modes, PML's wrapper in both modes (the numbers docs/distributed.md states),
whether our losses warn under PML's ``efficient=True``, three steps of ``CrossBatchMemory``, and
the user script of docs/distributed.md (its ``train`` at toy size, DDP). The test process
computes the one-process references and compares: our wrapper equals one process on the
concatenated batch in value and gradient (float64, <= 1e-10); the docs' table matches the
measured PML errors.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from pytorch_metric_learning.losses import ContrastiveLoss, MultiSimilarityLoss
from pytorch_metric_learning.reducers import DoNothingReducer
from pytorch_metric_learning.utils.distributed import (
    DistributedLossWrapper as PMLDistributedLossWrapper,
)

from pml_rank_plugins.losses import CrossBatchMemory, FastAPLoss, QuantizedAPLoss, RankedListLoss
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.utils import DistributedLossWrapper, DistributedMinerWrapper
from tests.ports import free_port
from tests.spawn import spawn_two, torn_down

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "distributed.md"
N, D, CLASSES, SPLIT = 12, 6, 4, (7, 5)  # uneven shards: the gather handles any sizes
PML_SPLIT = (6, 6)  # PML's all_gather needs shards of equal sizes
CBM_STEPS, CBM_MEMORY = 3, 20  # 36 rows through 20 slots: the queue wraps around
TOL = 1e-10

LOSSES = {
    "FastAPLoss": lambda: FastAPLoss(num_bins=10),
    "QuantizedAPLoss": lambda: QuantizedAPLoss(num_bins=10),
    "RankedListLoss": lambda: RankedListLoss(),
    "RankedListLoss(gallery_gradient)": lambda: RankedListLoss(gallery_gradient=True),
    "RankedListMiner + RankedListLoss": lambda: RankedListLoss(),
    "ContrastiveLoss (PML)": lambda: ContrastiveLoss(),
    "MultiSimilarityLoss (PML)": lambda: MultiSimilarityLoss(),
}
MINED = {"RankedListMiner + RankedListLoss"}
PML_ROWS = ["FastAPLoss", "QuantizedAPLoss", "RankedListLoss", "RankedListLoss(gallery_gradient)"]


def _batch(step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    labels = torch.randperm(N, generator=gen) % CLASSES
    return torch.randn(N, D, generator=gen, dtype=torch.float64), labels


def _rows(rank: int, split: tuple[int, int] = SPLIT) -> slice:
    start = sum(split[:rank])
    return slice(start, start + split[rank])


def _value_and_grad(fn, emb: torch.Tensor) -> tuple[float, torch.Tensor]:
    emb = emb.clone().requires_grad_(True)
    loss = fn(emb)
    loss.backward()
    return loss.item(), emb.grad


def _single(name: str) -> tuple[float, torch.Tensor]:
    """One process on the concatenated batch."""
    emb, labels = _batch()
    loss = LOSSES[name]()
    if name in MINED:
        miner = RankedListMiner()
        return _value_and_grad(lambda e: loss(e, labels, miner(e, labels)), emb)
    return _value_and_grad(lambda e: loss(e, labels), emb)


def _ours(name: str, rank: int, efficient: bool) -> tuple[float, torch.Tensor]:
    emb, labels = _batch()
    rows = _rows(rank)
    wrapper = DistributedLossWrapper(LOSSES[name](), efficient=efficient)
    if name in MINED:
        miner = DistributedMinerWrapper(RankedListMiner(), efficient=efficient)
        fn = lambda e: wrapper(e, labels[rows], miner(e, labels[rows]))  # noqa: E731
    else:
        fn = lambda e: wrapper(e, labels[rows])  # noqa: E731
    value, grad = _value_and_grad(fn, emb[rows])
    return value, grad / dist.get_world_size()  # DDP averages over the ranks


def _pml(name: str, rank: int, efficient: bool) -> tuple[float, torch.Tensor, list[str]]:
    emb, labels = _batch()
    rows = _rows(rank)
    rows = _rows(rank, PML_SPLIT)
    wrapper = PMLDistributedLossWrapper(LOSSES[name](), efficient=efficient)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad = _value_and_grad(lambda e: wrapper(e, labels[rows]), emb[rows])
    messages = [str(w.message) for w in caught if "DistributedLossWrapper" in str(w.message)]
    return value, grad / dist.get_world_size(), messages


def _memory_steps(rank: int | None, efficient: bool | None) -> list[tuple[float, torch.Tensor]]:
    """CBM_STEPS steps of CrossBatchMemory(FastAPLoss); ``rank=None``: one process."""
    memory = CrossBatchMemory(FastAPLoss(num_bins=10), embedding_size=D, memory_size=CBM_MEMORY)
    out = []
    for step in range(CBM_STEPS):
        emb, labels = _batch(step)
        if rank is None:
            out.append(_value_and_grad(lambda e: memory(e, labels), emb))  # noqa: B023
            continue
        rows = _rows(rank)
        wrapper = DistributedLossWrapper(memory, efficient=efficient)
        value, grad = _value_and_grad(lambda e: wrapper(e, labels[rows]), emb[rows])  # noqa: B023
        out.append((value, grad / 2))
    return out


def docs_script() -> dict:
    """The docs page's python block, executed: its namespace (``train``)."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert len(blocks) == 1, "docs/distributed.md: one python block, the user script"
    namespace: dict = {"__name__": "docs_distributed"}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    return namespace


SCRIPT_ARGS = dict(steps=3, global_batch=16, classes=4, dtype=torch.float64)


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = {"ours": {}, "pml": {}, "memory": {}, "script": {}}
        for name in LOSSES:
            for efficient in (False, True):
                results["ours"][name, efficient] = _ours(name, rank, efficient)
        for name in PML_ROWS:
            for efficient in (False, True):
                results["pml"][name, efficient] = _pml(name, rank, efficient)
        for efficient in (False, True):
            results["memory"][efficient] = _memory_steps(rank, efficient)
        train = docs_script()["train"]
        for efficient in (False, True):
            results["script"][efficient] = train(efficient=efficient, **SCRIPT_ARGS)
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()
    torn_down(out, rank)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = str(tmp_path_factory.mktemp("distributed_loss") / "results")
    spawn_two(_worker, (free_port(), out), out)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]


def _joined(ranks: list[dict], kind: str, key) -> tuple[list[float], torch.Tensor]:
    values = [r[kind][key][0] for r in ranks]
    return values, torch.cat([r[kind][key][1] for r in ranks])


@pytest.mark.slow  # two spawned processes (a few seconds of CPU)
@pytest.mark.parametrize("efficient", [False, True], ids=["full", "efficient"])
def test_ours_equals_one_process(ranks, efficient):
    for name in LOSSES:
        want_value, want_grad = _single(name)
        assert want_grad.abs().sum() > 0, name  # the batch gives every case a gradient
        values, grad = _joined(ranks, "ours", (name, efficient))
        for value in values:
            assert abs(value - want_value) <= TOL, (name, value, want_value)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=TOL, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("efficient", [False, True], ids=["full", "efficient"])
def test_cross_batch_memory_equals_one_process(ranks, efficient):
    want = _memory_steps(None, None)
    for step, (want_value, want_grad) in enumerate(want):
        got_values = [r["memory"][efficient][step][0] for r in ranks]
        got_grad = torch.cat([r["memory"][efficient][step][1] for r in ranks])
        assert all(abs(v - want_value) <= TOL for v in got_values), (step, got_values, want_value)
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=TOL, msg=f"step {step}")


@pytest.mark.slow
def test_docs_script_under_ddp_equals_one_process(ranks):
    want = docs_script()["train"](**SCRIPT_ARGS)
    for efficient in (False, True):
        for r in ranks:
            got = r["script"][efficient]
            for key, value in want.items():
                torch.testing.assert_close(got[key], value, rtol=0, atol=1e-9, msg=key)


def measured_pml_table(ranks: list[dict]) -> list[str]:
    """The rows of docs/distributed.md's table of PML's wrapper, from the measurement."""
    lines = []
    for name in PML_ROWS:
        want_value, want_grad = _single(name)
        cells = []
        for efficient in (False, True):
            values, grad = _joined(ranks, "pml", (name, efficient))
            err = _rel(grad, want_grad)
            cells += [f"{err:.2g}" if err > 1e-9 else "exact", f"{values[0] / want_value:.3g}x"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


@pytest.mark.slow
def test_pml_wrapper_numbers_in_the_docs(ranks):
    rows = measured_pml_table(ranks)
    text = DOC.read_text()
    missing = [row for row in rows if row not in text]
    assert (
        not missing
    ), "docs/distributed.md's PML table differs from the measurement:\n" + "\n".join(rows)
    # The claims the page makes of them: efficient=False exact, efficient=True wrong.
    assert all("| exact | 2x |" in row for row in rows), rows
    assert all(row.count("exact") == 1 for row in rows), rows


@pytest.mark.slow
def test_our_losses_warn_under_pml_efficient_only(ranks):
    for r in ranks:
        for name in PML_ROWS:
            assert r["pml"][name, False][2] == [], name
            (message,) = r["pml"][name, True][2]
            assert "efficient=True" in message and "docs/distributed.md" in message


def test_one_process_is_the_loss_itself():
    emb, labels = _batch()
    for efficient in (False, True):
        got = DistributedLossWrapper(FastAPLoss(), efficient=efficient)(emb, labels)
        assert float(got) == float(FastAPLoss()(emb, labels))
        indices = DistributedMinerWrapper(RankedListMiner(), efficient=efficient)(emb, labels)
        want = RankedListMiner()(emb, labels)
        assert all(torch.equal(a, b) for a, b in zip(indices, want))


@pytest.mark.parametrize(
    "loss, match",
    [
        (QuantizedAPLoss(class_balanced=True), "class_balanced"),
        (RankedListLoss(query_weighting="weight_share"), "weight_share"),
        (ContrastiveLoss(reducer=DoNothingReducer()), "DoNothingReducer"),
    ],
)
def test_efficient_refuses_what_it_cannot_split(loss, match):
    with pytest.raises(ValueError, match=match):
        DistributedLossWrapper(loss, efficient=True)
    DistributedLossWrapper(loss, efficient=False)  # the full loss is always exact


def test_type_errors():
    with pytest.raises(TypeError, match="PML loss"):
        DistributedLossWrapper(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="PML miner"):
        DistributedMinerWrapper(FastAPLoss())
