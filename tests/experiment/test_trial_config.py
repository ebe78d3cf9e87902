"""A tuning trial's config (moved from running/tune.py to experiment/search_space.py, issue 30)."""

from __future__ import annotations

from pml_rank_plugins.experiment.search_space import trial_config
from tests.tiny import tiny_config


def test_trial_config_sets_params_hides_test_splits_and_names_the_trial():
    cfg = tiny_config()
    cfg["eval"]["revisited"] = [{"dataset": {"X": {}}}]
    cfg["tune"] = {"space": {"optimizers.trunk_optimizer.Adam.lr": {"low": 1e-4, "high": 1e-1}}}
    out = trial_config(cfg, {"optimizers.trunk_optimizer.Adam.lr": 0.05}, "A trial3")
    assert out["optimizers"]["trunk_optimizer"]["Adam"]["lr"] == 0.05
    assert out["eval"]["test"] == [] and "revisited" not in out["eval"]
    assert out["eval"]["validation"] == ["val"] and out["name"] == "A trial3"
    assert "tune" not in out
    # the method's config is left as it was
    assert cfg["eval"]["test"] == ["test"] and cfg["name"] == "tiny" and "revisited" in cfg["eval"]
    assert cfg["optimizers"]["trunk_optimizer"]["Adam"]["lr"] == 0.01
    # a config without eval: still no test splits
    bare = tiny_config()
    bare.pop("eval")
    assert trial_config(bare, {}, "B trial0")["eval"] == {"test": []}
