"""A config without ``eval.recall_at_k`` reports Recall@{1, 2, 4, 8}, the Ks CUB-200 and Cars196
results are usually given at (e.g. the Ranked List Loss paper): the default of the builder's
tester, not only of the calculator's constructor."""

from __future__ import annotations

import torch

from pml_rank_plugins.experiment import builder
from tests.tiny import tiny_config


def test_default_recall_at_k_is_1_2_4_8():
    cfg = tiny_config()
    del cfg["eval"]["recall_at_k"]
    tester = builder.build_tester(cfg, torch.device("cpu"))
    recalls = [m for m in tester.accuracy_calculator.get_curr_metrics() if m.startswith("recall")]
    assert sorted(recalls, key=lambda m: int(m.rsplit("_", 1)[1])) == [
        "recall_at_1",
        "recall_at_2",
        "recall_at_4",
        "recall_at_8",
    ]


def test_configured_recall_at_k_replaces_the_default():
    cfg = tiny_config()
    cfg["eval"]["recall_at_k"] = [1, 16]
    tester = builder.build_tester(cfg, torch.device("cpu"))
    recalls = {m for m in tester.accuracy_calculator.get_curr_metrics() if m.startswith("recall")}
    assert recalls == {"recall_at_1", "recall_at_16"}
