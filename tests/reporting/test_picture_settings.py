"""``eval.pictures``: how many queries and neighbours ``compare`` draws per method, and whether it
writes the PDF copies; parsed once into the spec, checked naming the key, evaluation only."""

from __future__ import annotations

import json

import pytest

from pml_rank_plugins.experiment import spec as spec_module
from pml_rank_plugins.experiment import tuned
from pml_rank_plugins.experiment.schema import ConfigError, validate
from pml_rank_plugins.experiment.spec import EvalSettings, PictureSettings, RunSpec
from pml_rank_plugins.reporting import compare
from tests.tiny import tiny_config


def test_defaults_and_a_partial_section():
    assert EvalSettings.parse({}).pictures == PictureSettings(num_queries=8, k=5, pdf=True)
    assert spec_module.PICTURE_DEFAULTS == {"num_queries": 8, "k": 5, "pdf": True}
    partial = EvalSettings.parse({"eval": {"pictures": {"k": 2}}}).pictures
    assert (partial.num_queries, partial.k, partial.pdf) == (8, 2, True)


def test_the_recorded_section_is_unchanged_without_pictures():
    # runs written before eval.pictures existed record the same eval section
    assert "pictures" not in EvalSettings.parse(tiny_config()).section


@pytest.mark.parametrize(
    "pictures, match",
    [
        (3, r"eval\.pictures: expected a mapping"),
        ({"queries": 2}, r"eval\.pictures: unknown key\(s\) \['queries'\]"),
        ({"num_queries": 0}, r"eval\.pictures\.num_queries"),
        ({"num_queries": 65}, r"eval\.pictures\.num_queries"),
        ({"k": 2.5}, r"eval\.pictures\.k"),
        ({"k": True}, r"eval\.pictures\.k"),
        ({"pdf": "yes"}, r"eval\.pictures\.pdf: expected true or false, got 'yes'"),
    ],
)
def test_bad_values_are_refused_naming_the_key(pictures, match):
    with pytest.raises(ConfigError, match=match):
        validate(tiny_config(eval={"pictures": pictures}))


def test_pictures_are_evaluation_only_for_a_tuned_comparison():
    assert tuned.change_allowed("eval.pictures")
    assert tuned.change_allowed("eval.pictures.num_queries")


def test_compare_draws_what_the_config_asks(tmp_path):
    cfg = tiny_config(
        trainer={"MetricLossOnly": {"num_epochs": 1, "iterations_per_epoch": 1}},
        eval={"pictures": {"num_queries": 2, "k": 3, "pdf": False}},
    )
    summary = compare.run_comparison({"A": RunSpec.of(cfg)}, tmp_path, seeds=1, pictures=True)
    names = sorted(p.rsplit("/", 1)[-1] for p in summary["pictures"]["A"])
    assert names == ["retrieval.json", "retrieval.png", "worst_queries.png"]
    assert not list((tmp_path / "A").glob("*.pdf"))
    record = json.loads((tmp_path / "A" / "retrieval.json").read_text())
    assert len(record["queries"]) == 2 and len(record["worst"]) == 2
    assert all(len(q["retrieved"]) == 3 for q in record["queries"] + record["worst"])
