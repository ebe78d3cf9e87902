"""RunSpec: one config parsed and validated once (issue 30 item 1)."""

from __future__ import annotations

import copy
import pickle

import pytest

from pml_rank_plugins.experiment import methods, spec
from pml_rank_plugins.experiment.schema import ConfigError, dump_yaml
from pml_rank_plugins.experiment.spec import EvalSettings, Protocol, RunSpec
from pml_rank_plugins.running.run_folder import RunFolderError
from tests.tiny import tiny_config


def mlrc_config(**split) -> dict:
    cfg = tiny_config()
    cfg["split"] = {"mlrc_protocol": {"num_folds": 3}, **split}
    return cfg


def test_eval_defaults_in_one_place():
    cfg = tiny_config()
    cfg.pop("eval")
    ev = EvalSettings.parse(cfg)
    assert ev.primary_metric == "mean_average_precision_at_r"
    assert ev.metrics == ("precision_at_1", "r_precision", "mean_average_precision_at_r")
    assert ev.recall_at_k == (1, 2, 4, 8)
    assert (ev.k, ev.test_interval, ev.patience) == ("max_bin_count", 1, None)
    assert (ev.validation, ev.test, ev.tester) == (("val",), (), None)
    # the dict form (builder.eval_settings) holds the same defaults, a fresh copy each time
    ev.section["metrics"].append("x")
    assert EvalSettings.parse(cfg).section["metrics"] == list(ev.metrics)


def test_eval_entries_filter_by_available_splits():
    cfg = tiny_config(eval={"validation": ["val", {"query": "q", "reference": ["g"]}]})
    ev = EvalSettings.parse(cfg)
    assert ev.entries(["validation", "test"]) == ["val", {"query": "q", "reference": ["g"]}, "test"]
    assert ev.entries(["validation"], {"val": 1, "g": 2}) == ["val"]
    assert ev.entries(["validation"], {"q": 1}) == [{"query": "q", "reference": ["g"]}]


def test_protocol_single_mlrc_all_folds_and_one_fold():
    assert Protocol.parse(tiny_config()) == Protocol("single")
    assert Protocol.parse(mlrc_config()) == Protocol("mlrc", None, 3)
    assert Protocol.parse(mlrc_config()).all_folds
    one = Protocol.parse(mlrc_config(fold=2))
    assert (one.kind, one.fold, one.num_folds, one.all_folds) == ("mlrc", 2, 3, False)
    folded = RunSpec.parse(mlrc_config()).fold(1)
    assert folded.protocol == Protocol("mlrc", 1, 3) and folded["split"]["fold"] == 1
    with pytest.raises(ValueError, match="not an MLRC"):
        RunSpec.parse(tiny_config()).fold(0)


def test_fields_seed_device_root_trainer():
    s = RunSpec.parse(tiny_config(seed=7, device="cpu", data_root="/data"))
    assert (s.name, s.seed, s.device, s.data_root) == ("tiny", 7, "cpu", "/data")
    assert (s.trainer.name, s.trainer.num_epochs, s.trainer.amp) == ("MetricLossOnly", 2, None)
    assert "num_epochs" not in s.trainer.kwargs and s.trainer.kwargs["batch_size"] == 12
    assert s.device_for(None) == "cpu" and s.device_for("cuda:1") == "cuda:1"
    assert str(s.torch_device()) == "cpu"
    with pytest.raises(ConfigError, match="--device: unknown device 'tpu'"):
        s.device_for("tpu")


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True, 2**32])
def test_a_bad_seed_is_refused_naming_the_key(seed):
    with pytest.raises(ConfigError, match="seed"):
        RunSpec.parse(tiny_config(seed=seed))


def test_a_spec_reads_like_its_config_and_copies_as_a_dict():
    cfg = tiny_config()
    s = RunSpec.parse(cfg)
    assert s == cfg and dict(s) == s.config and s["seed"] == 0 and s.get("nope", 1) == 1
    assert s.config is not cfg  # parsed from a copy: the caller's dict is not kept
    copied = copy.deepcopy(s)
    assert type(copied) is dict and copied == cfg
    again = pickle.loads(pickle.dumps(s))  # spawn workers receive specs
    assert isinstance(again, RunSpec) and again == s and again.eval == s.eval
    assert RunSpec.of(s) is s


def test_seeded_runs_do_the_seed_arithmetic_once():
    s = RunSpec.parse(tiny_config(seed=3))
    runs = s.seeded_runs("A", 3)
    assert [r.seed for r in runs] == [3, 4, 5]
    assert [r["seed"] for r in runs] == [3, 4, 5] and {r.name for r in runs} == {"A"}
    assert s.seed == 3 and s["seed"] == 3 and s.name == "tiny"  # the base is untouched
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        s.seeded_runs("A", 0)


def test_load_is_the_reader_of_a_run_folder(tmp_path):
    with pytest.raises(RunFolderError, match="is not a run folder"):
        RunSpec.load(tmp_path)
    dump_yaml(tiny_config(data_root="/old"), tmp_path / "config.yaml")
    assert RunSpec.load(tmp_path).data_root == "/old"
    moved = RunSpec.load(tmp_path, "/new")
    assert moved.data_root == "/new" and moved["data_root"] == "/new"


def test_collect_methods_validates_each_selected_method_once(tmp_path, monkeypatch):
    calls = []
    real = spec.validate
    monkeypatch.setattr(spec, "validate", lambda c: calls.append(c["name"]) or real(c))
    cfg = tiny_config()
    cfg["methods"] = {"A": {}, "B": {"seed": 1}, "C": {"models": {"trunk": {"Missing": {}}}}}
    path = tmp_path / "m.yaml"
    dump_yaml(cfg, path)
    got = methods.collect_methods([path], (), ["A", "B"])
    assert calls == ["A", "B"]  # C is not selected: never validated
    assert all(isinstance(s, RunSpec) for s in got.values()) and got["B"].seed == 1
    assert methods.collected(got) and not methods.collected(cfg) and not methods.collected({})


def test_check_methods_checks_a_spec_once_and_shared_models_once(monkeypatch):
    built = []
    real = methods.builder.build_models
    monkeypatch.setattr(
        methods.builder, "build_models", lambda c, d: built.append(c["name"]) or real(c, d)
    )
    cfg = tiny_config()
    cfg["methods"] = {"A": {}, "B": {"seed": 1}}
    got = methods.collect_methods(cfg)
    methods.check_methods(got)
    assert built == ["A"]  # one models section: built once
    methods.check_methods(got)
    assert built == ["A"]  # checked specs are not checked again
    other = tiny_config(models={"trunk": {"TinyNet": {"embedding_dim": 8}}})
    methods.check_methods({"A": got["A"], "D": RunSpec.parse(other)})
    assert built == ["A", "tiny"]
