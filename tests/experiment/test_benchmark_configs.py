"""Every config in pml_rank_plugins/experiment/configs/benchmarks/: `pml-rank check` passes on a fixture tree
in the dataset's published format (with a ResNet-50 weights file where the config expects it), and
one training iteration + the configured evaluation run end to end with the trunk swapped for a
small convnet via --set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pml_rank_plugins import cli
from pml_rank_plugins.experiment.schema import expand_methods, load_yaml
from tests.data.benchmark_fixtures import WRITERS, write_all

BENCHMARKS = Path(cli.__file__).resolve().parent / "experiment" / "configs" / "benchmarks"
NAMES = sorted(WRITERS)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("data"))


def test_the_benchmark_folder_holds_exactly_the_documented_configs():
    assert sorted(p.name for p in BENCHMARKS.glob("*.yaml")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_config_header_names_its_sources(name):
    head = (BENCHMARKS / name).read_text().split("\nseed:")[0]
    assert "Source of every setting" in head and "pml-rank" in head and "Published" in head
    assert "DEVIATION" in head or "OURS" in head


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_check_passes_on_published_format_fixtures(name, data_root, capsys):
    # The benchmark configs name device: cuda; check refuses a device this machine lacks, as
    # train does (issue 41), so a CPU machine checks them for cpu.
    args = ["check", str(BENCHMARKS / name), "--data-root", str(data_root), "--device", "cpu"]
    assert cli.main(args) == 0
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
