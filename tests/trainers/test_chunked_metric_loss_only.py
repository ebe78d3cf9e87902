import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner
from pytorch_metric_learning.trainers import MetricLossOnly

from pml_rank_plugins.losses import FastAPLoss
from pml_rank_plugins.trainers import ChunkedMetricLossOnly
from tests.conftest import TEST_DEVICE


class TwoLevel(torch.utils.data.Dataset):
    def __init__(self, n=48):
        gen = torch.Generator().manual_seed(0)
        # on the host, as a dataset's items are; the trainer moves batches to its data_device
        self.x = torch.randn(n, 6, generator=gen, dtype=torch.float64, device="cpu")
        classes = torch.arange(n, device="cpu")
        self.labels = torch.stack([classes % 6, classes % 2], dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.labels[i]


def run(trainer_cls, loss, miner=None, **extra):
    torch.manual_seed(3)
    trunk = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh()).double()
    embedder = torch.nn.Linear(12, 4).double()
    params = list(trunk.parameters()) + list(embedder.parameters())
    seen = []
    trainer = trainer_cls(
        models={"trunk": trunk, "embedder": embedder},
        optimizers={
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=0.1),
        },
        batch_size=24,
        loss_funcs={"metric_loss": loss},
        mining_funcs={"tuple_miner": miner} if miner else {},
        dataset=TwoLevel(),
        sampler=torch.utils.data.SequentialSampler(range(48)),
        iterations_per_epoch=2,
        label_hierarchy_level=0,
        loss_weights={"metric_loss": 0.5},
        gradient_clippers={
            "trunk_grad_clipper": lambda: torch.nn.utils.clip_grad_norm_(params, 0.05)
        },
        data_device=TEST_DEVICE,  # where the models are (built on the default device)
        # no loader workers (PML's default is 2): an epoch cut short by iterations_per_epoch
        # leaves them to be shut down when the trainer is collected, a 10 s stall of a later test
        dataloader_num_workers=0,
        dtype=torch.float64,
        end_of_iteration_hook=lambda t: seen.append(
            float(torch.as_tensor(t.losses["total_loss"]).detach())
        ),
        **extra,
    )
    trainer.train(num_epochs=1)
    return [p.detach().clone() for p in params], seen


@pytest.mark.parametrize(
    "loss, miner",
    [(FastAPLoss(), None), (ContrastiveLoss(), MultiSimilarityMiner(0.3))],
    ids=["plugin FastAP", "PML Contrastive + miner"],
)
def test_two_steps_equal_plain_metric_loss_only(loss, miner):
    want, want_losses = run(MetricLossOnly, loss, miner)
    got, got_losses = run(ChunkedMetricLossOnly, loss, miner, chunk_size=5, check_replay=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    assert got_losses == pytest.approx(want_losses, abs=1e-12) and len(got_losses) == 2


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedMetricLossOnly(
            models={"trunk": torch.nn.Identity()},
            optimizers={},
            batch_size=4,
            loss_funcs={"metric_loss": FastAPLoss()},
            dataset=TwoLevel(),
            chunk_size=0,
        )
