"""``runner.train`` in 2 gloo processes equals the 1-process run of the same config.

One pair of spawned processes (module fixture) runs every 2-process scenario in turn, so the
suite pays the process start-up once. The models compute in float64 (``TinyNet64``) with frozen
BatchNorm, so "equal" means equal up to float64 rounding of a differently ordered sum.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from pml_rank_plugins.experiment import builder, registry
from pml_rank_plugins.experiment.schema import deep_merge
from pml_rank_plugins.running import distributed, runner
from pml_rank_plugins.running.checkpoints import load_checkpoint
from tests.ports import free_port
from tests.spawn import spawn_two, torn_down
from tests.tiny import TinyNet, tiny_config


class TinyNet64(TinyNet):
    """``TinyNet`` in float64 (inputs cast), for exact comparisons."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.double()

    def forward(self, x):
        return super().forward(x.double())


registry.register("TinyNet64", TinyNet64)
# one pair of spawned processes, 8 short runs (about 35 s of CPU), built once per worker:
# `--dist loadfile` (make test) keeps the module on one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed_runs")]

BASE = {
    "models": {"trunk": {"TinyNet64": {"embedding_dim": 16}}},
    "loss_funcs": {"metric_loss": {"pml_rank_plugins.FastAPLoss": {"num_bins": 10}}},
    "trainer": {"MetricLossOnly": {"freeze_trunk_batchnorm": True}},
}
SCENARIOS = {
    "plain": tiny_config(**BASE),
    "chunked_pml_loss_and_miner": tiny_config(
        **deep_merge(
            BASE,
            {
                "trainer": {
                    "ChunkedMetricLossOnly": {
                        "chunk_size": 4,
                        "batch_size": 12,
                        "iterations_per_epoch": 3,
                        "num_epochs": 2,
                        "freeze_trunk_batchnorm": True,
                    }
                },
                "loss_funcs": {"metric_loss": {"TripletMarginLoss": {"margin": 0.1}}},
                "mining_funcs": {"tuple_miner": {"TripletMarginMiner": {"margin": 0.2}}},
            },
        )
    ),
    "category_hard_ranked_list": tiny_config(
        **deep_merge(
            BASE,
            {
                "sampler": {"CategoryHardSampler": {"batches_per_pair": 2, "samples_per_class": 3}},
                "loss_funcs": {"metric_loss": {"pml_rank_plugins.RankedListLoss": {}}},
            },
        )
    ),
}
# a global batch of 12 that does not split evenly over 2 ranks is covered by chunk_size 4 (6 + 6
# rows in chunks 4 + 2) and by the uneven gather of tests/trainers/test_distributed.py


def _worker(rank: int, port: int, root: str) -> None:
    """One torchrun-like process: the runner sets the process group up from the environment."""
    torch.set_num_threads(1)
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "MASTER_PORT": port}
    os.environ.update({k: str(v) for k, v in env.items()}, MASTER_ADDR="127.0.0.1")
    try:
        for name, cfg in SCENARIOS.items():
            runner.train(cfg, f"{root}/{name}")
            assert dist.get_world_size() == 2 and dist.get_backend() == "gloo"
        # interrupted after epoch 1, then resumed: the same as "plain" run straight through
        runner.train(SCENARIOS["plain"], f"{root}/resumed", stop_after_epoch=1)
        torch.manual_seed(1234 + rank)  # resume must not depend on the RNG states it finds
        runner.train(None, f"{root}/resumed", resume=True)
    finally:
        distributed.shutdown()
    torn_down(f"{root}/spawn", rank)


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    spawn_two(_worker, (free_port(), str(root)), f"{root}/spawn")
    return root


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    for name, cfg in SCENARIOS.items():
        runner.train(cfg, root / name)
    return root


def _weights(run_dir) -> dict:
    return load_checkpoint(run_dir / "checkpoints" / "latest.pt")["models"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_two_processes_equal_one_process(two_process_runs, one_process_runs, scenario):
    two, one = _weights(two_process_runs / scenario), _weights(one_process_runs / scenario)
    assert two.keys() == one.keys()
    for model, state in one.items():
        assert not any(k.startswith("module.") for k in two[model]), "DDP prefix saved"
        for key, want in state.items():
            torch.testing.assert_close(
                two[model][key], want, rtol=1e-9, atol=1e-12, msg=f"{model}.{key}"
            )
    initial = builder.build_experiment(SCENARIOS[scenario]).models["trunk"].state_dict()
    assert not torch.allclose(initial["fc.weight"], one["trunk"]["fc.weight"]), "no training"
    m2 = json.loads((two_process_runs / scenario / "metrics.json").read_text())
    m1 = json.loads((one_process_runs / scenario / "metrics.json").read_text())
    assert [h["epoch"] for h in m2["history"]] == [h["epoch"] for h in m1["history"]]
    for h2, h1 in zip(m2["history"], m1["history"]):
        assert h2["validation"]["val"] == pytest.approx(h1["validation"]["val"], abs=1e-9)
    assert m2["test"]["test"] == pytest.approx(m1["test"]["test"], abs=1e-9)


def test_rank0_writes_one_metrics_json_and_one_tensorboard_log(two_process_runs):
    run = two_process_runs / "plain"
    metrics = json.loads((run / "metrics.json").read_text())
    info = metrics["run_info"]
    assert info["world_size"] == 2 and info["backend"] == "gloo"
    assert info["devices"] == ["cpu", "cpu"]
    assert {"torch", "pytorch_metric_learning", "pml_rank_plugins"} <= set(info)
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock",  # rank 0's run-folder lock (one file, whatever the world size)
        "checkpoints",
        "config.yaml",
        "embeddings",  # the final test's, for the pictures
        "logs",
        "metrics.json",
        "tensorboard",
    ]
    assert not list(run.rglob("*.tmp"))


def test_single_process_run_records_run_info(one_process_runs):
    info = json.loads((one_process_runs / "plain" / "metrics.json").read_text())["run_info"]
    assert info["world_size"] == 1 and info["backend"] is None and info["devices"] == ["cpu"]
    assert info["torch"] == torch.__version__


def test_resume_under_two_processes_equals_uninterrupted(two_process_runs):
    straight, resumed = two_process_runs / "plain", two_process_runs / "resumed"
    for model, state in _weights(straight).items():
        for key, value in state.items():
            assert torch.equal(value, _weights(resumed)[model][key]), (model, key)
    a = json.loads((straight / "metrics.json").read_text())
    b = json.loads((resumed / "metrics.json").read_text())
    assert a["history"] == b["history"] and a["test"] == b["test"]
