"""Every config in pml_rank_plugins/experiment/configs/benchmarks/: `pml-rank check` passes on a fixture tree
in the dataset's published format (with a ResNet-50 weights file where the config expects it), and
one training iteration + the configured evaluation run end to end with the trunk swapped for a
small convnet via --set.

The check builds the configs' ResNet-50 once per method and once per value of every tune-space
dimension (``check_space_values``): 40 ResNet-50s for an MLRC config. Each one's random Kaiming
initialisation (two passes of a random number generator over 23.5M weights, about 0.45 s of CPU,
80% of the check) is overwritten by the weights file right after (``load_resnet_weights``), so
the check test skips drawing it (:func:`kaiming_without_draw`); everything else is built and
loaded as ``pml-rank check`` does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pml_rank_plugins import cli
from pml_rank_plugins.experiment.schema import expand_methods, load_yaml
from tests.data.benchmark_fixtures import WRITERS, write_all

BENCHMARKS = Path(cli.__file__).resolve().parent / "experiment" / "configs" / "benchmarks"
NAMES = sorted(WRITERS)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("data"))


def kaiming_without_draw(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """``torch.nn.init.kaiming_*_`` without the random draw: the arguments are checked as torch
    checks them (the fan of ``tensor`` for ``mode``, the gain of ``nonlinearity``), and the
    tensor is zeroed instead of filled with random numbers."""
    torch.nn.init._calculate_correct_fan(tensor, mode)  # noqa: SLF001 -- torch's own check
    torch.nn.init.calculate_gain(nonlinearity, a)
    with torch.no_grad():
        return tensor.zero_()


@pytest.fixture
def no_random_kaiming_init(monkeypatch):
    """The ResNet-50 weights the check builds are replaced by the weights file: skip drawing
    their random initial values (torchvision's ResNet and torch's Conv2d/Linear call these two
    through ``torch.nn.init``)."""
    monkeypatch.setattr(torch.nn.init, "kaiming_normal_", kaiming_without_draw)
    monkeypatch.setattr(torch.nn.init, "kaiming_uniform_", kaiming_without_draw)


def test_kaiming_without_draw_checks_the_arguments_as_torch_does():
    weight = torch.ones(4, 3, 2, 2)
    assert kaiming_without_draw(weight, mode="fan_out", nonlinearity="relu") is weight
    assert not weight.any()
    with pytest.raises(ValueError, match="Mode"):
        kaiming_without_draw(weight, mode="fan_middle")
    with pytest.raises(ValueError, match="nonlinearity"):
        kaiming_without_draw(weight, nonlinearity="swish")


def test_the_benchmark_folder_holds_exactly_the_documented_configs():
    assert sorted(p.name for p in BENCHMARKS.glob("*.yaml")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_config_header_names_its_sources(name):
    head = (BENCHMARKS / name).read_text().split("\nseed:")[0]
    assert "Source of every setting" in head and "pml-rank" in head and "Published" in head
    assert "DEVIATION" in head or "OURS" in head


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_check_passes_on_published_format_fixtures(name, data_root, capsys, no_random_kaiming_init):
    assert cli.main(["check", str(BENCHMARKS / name), "--data-root", str(data_root)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    methods = expand_methods(load_yaml(BENCHMARKS / name), default_name=Path(name).stem)
    assert lines[0] == f"== {BENCHMARKS / name}" and len(lines) == 1 + len(methods)
    for line, method in zip(lines[1:], methods):
        assert line.startswith(f"{method}: data[") and "ResNetTrunk(23.51M)" in line
    print("\n".join(lines))  # shown with -s: the check output quoted in the closing note


SMALL = [
    "device=cpu",
    "models.trunk={ConvEmbedder: {in_channels: 3, embedding_dim: 8, widths: [4]}}",
    "models.embedder.EmbeddingHead.in_features=8",
    "trainer.num_epochs=1",
    "trainer.iterations_per_epoch=1",
    "trainer.dataloader_num_workers=0",
    "eval.tester.dataloader_num_workers=0",
    # tiny images: 32 px instead of 224/227 (the configs' own lists are built by the check test)
    "transforms.train=[{RandomResizedCrop: {size: 32}}, {RandomHorizontalFlip: {}}, {ToTensor: {}}]",
    "transforms.eval=[{Resize: {size: 36}}, {CenterCrop: {size: 32}}, {ToTensor: {}}]",
]
# small batches the fixture trees can fill (the configs' own sizes are checked above)
BATCH = {"rll_sop.yaml": 18, "mapq_roxford.yaml": 16}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_one_iteration_and_evaluation_end_to_end(name, data_root, tmp_path, capsys):
    method = next(iter(expand_methods(load_yaml(BENCHMARKS / name), Path(name).stem)))
    sets = SMALL + [f"trainer.batch_size={BATCH.get(name, 16)}"]
    argv = ["train", str(BENCHMARKS / name), "--data-root", str(data_root), "--method", method]
    argv += ["--out", str(tmp_path)] + [a for s in sets for a in ("--set", s)]
    assert cli.main(argv) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    test = metrics["test"]
    values = [v for entry in test.values() for v in entry.values()]
    assert values and all(math.isfinite(v) for v in values)
    if name.startswith("mlrc_"):
        assert set(test) == {"concatenated", "separated"} and metrics["num_folds"] == 4
        assert metrics["embedding_dim"] == {"concatenated": 4 * 128, "separated": 128}
    elif name == "mapq_roxford.yaml":
        assert set(test) == {"roxford5k", "rparis6k"}
        assert {"map_easy", "map_medium", "map_hard", "mp_at_1_medium"} <= set(test["roxford5k"])
    else:
        expected = {
            "fastap_inshop.yaml": {"query"},
            "fastap_vehicleid.yaml": {"test800", "test1600", "test2400"},
        }.get(name, {"test"})
        assert set(test) == expected and "recall_at_1" in next(iter(test.values()))
