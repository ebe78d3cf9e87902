"""``pml-rank list``: names grouped by kind, ``--kind KIND``, and the kind of each class."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import distances, losses, miners, reducers, samplers, trainers
from torch.optim.lr_scheduler import StepLR
from torchvision import models as tv_models
from torchvision import transforms

from pml_rank_plugins import losses as ours
from pml_rank_plugins import miners as our_miners
from pml_rank_plugins import samplers as our_samplers
from pml_rank_plugins import trainers as our_trainers
from pml_rank_plugins.cli import main
from pml_rank_plugins.cli_args import LIST_KINDS
from pml_rank_plugins.data import GlyphDataset, as_two_level
from pml_rank_plugins.experiment import registry


def _groups(out: str) -> dict[str, list[str]]:
    """``{kind: [name, ...]}`` from the printed listing (a ``kind:`` header, indented rows)."""
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            assert line.endswith(":"), line
            current = line[:-1]
            groups[current] = []
        else:
            groups[current].append(line.split()[0])
    return groups


@pytest.mark.parametrize(
    "obj, kind",
    [
        (ours.FastAPLoss, "losses"),
        (losses.CrossBatchMemory, "losses"),  # a loss wrapper, not a BaseMetricLossFunction
        (losses.SelfSupervisedLoss, "losses"),
        (torch.nn.CrossEntropyLoss, "losses"),  # torch losses are nn.Modules, but losses
        (miners.MultiSimilarityMiner, "miners"),
        (our_miners.RankedListMiner, "miners"),
        (samplers.MPerClassSampler, "samplers"),
        (our_samplers.CategoryHardSampler, "samplers"),
        (trainers.MetricLossOnly, "trainers"),
        (our_trainers.ChunkedMetricLossOnly, "trainers"),
        (GlyphDataset, "datasets"),
        (torch.nn.Linear, "models"),
        (tv_models.resnet18, "models"),  # a factory: its return annotation is ResNet
        (torch.optim.Adam, "optimizers"),
        (transforms.RandomCrop, "other"),  # an nn.Module, but a transform
        (distances.CosineSimilarity, "other"),  # an nn.Module, but a distance
        (reducers.MeanReducer, "other"),
        (StepLR, "other"),
        (as_two_level, "other"),
    ],
)
def test_kind_of_decides_by_the_class(obj, kind):
    assert registry.kind_of(obj) == kind


def test_the_parser_offers_the_registrys_kinds():
    assert LIST_KINDS == registry.KINDS


def test_listing_by_kind_partitions_the_full_listing():
    groups = {kind: registry.listing(kind) for kind in registry.KINDS}
    every = sorted(registry.listing())
    assert sorted(row for rows in groups.values() for row in rows) == every
    with pytest.raises(ValueError, match="losses, miners"):
        registry.listing("loss")


def test_list_groups_names_by_kind(capsys):
    assert main(["list"]) == 0
    groups = _groups(capsys.readouterr().out)
    assert list(groups) == list(LIST_KINDS)
    assert {"FastAPLoss", "pml_rank_plugins.FastAPLoss", "QuantizedAPLoss"} <= set(groups["losses"])
    assert "RandomCrop" in groups["other"] and "RandomCrop" not in groups["models"]
    assert "Adam" in groups["optimizers"] and "MPerClassSampler" in groups["samplers"]


def test_list_kind_lists_that_kind_only(capsys):
    assert main(["list", "--kind", "losses"]) == 0
    groups = _groups(capsys.readouterr().out)
    assert list(groups) == ["losses"]
    assert groups["losses"] == [n for n, _ in registry.listing("losses")]
    assert "Adam" not in groups["losses"] and "Linear" not in groups["losses"]
    # with a substring: both filters apply
    assert main(["list", "--kind", "losses", "RankedList"]) == 0
    assert _groups(capsys.readouterr().out) == {
        "losses": ["RankedListLoss", "pml_rank_plugins.RankedListLoss"]
    }
    assert main(["list", "--kind", "miners", "FastAP"]) == 1
    assert "among the miners" in capsys.readouterr().err


def test_list_bad_kind_exits_2_naming_the_kinds(capsys):
    with pytest.raises(SystemExit) as e:
        main(["list", "--kind", "loss"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'loss'" in err and all(k in err for k in LIST_KINDS)


# -- shipped configs (issue 41, item 5) -------------------------------------------------------------
def test_list_kind_configs_lists_every_shipped_config(capsys):
    from pml_rank_plugins.commands.listing import shipped_config_rows
    from pml_rank_plugins.experiment import shipped_configs

    assert main(["list", "--kind", "configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "configs:"
    names = [line.split()[0] for line in out[1:]]
    assert names == list(shipped_configs()) and len(names) >= 20
    assert {"default", "omniglot", "studies/omniglot", "claims/fastap_bins"} <= set(names)
    assert any(n.startswith("ablations/") for n in names)
    for (name, description), line in zip(shipped_config_rows(), out[1:], strict=True):
        assert description, f"{name}: no description comment"
        assert line.split(None, 1)[1] == description
    assert main(["list", "--kind", "configs", "claims"]) == 0  # the substring filter applies
    assert all("claim" in line.lower() for line in capsys.readouterr().out.splitlines()[1:])


def test_docs_configs_page_lists_exactly_the_shipped_configs():
    from pathlib import Path

    from pml_rank_plugins.commands.listing import shipped_config_rows

    text = (Path(__file__).resolve().parents[1] / "docs" / "configs.md").read_text()
    section = text.split("## Shipped configs", 1)[1].split("\n## ", 1)[0]
    listed = [line for line in section.splitlines() if line.startswith("| `")]
    want = [f"| `{n}` | {d.replace('|', '/')} |" for n, d in shipped_config_rows()]
    assert listed == want, "regenerate docs/configs.md's table from `pml-rank list --kind configs`"
