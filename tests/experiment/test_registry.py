"""Registry: resolution order, the PML/plugin collision rule, dotted paths, errors."""

from __future__ import annotations

import pytest
import pytorch_metric_learning.losses as pml_losses
import torch

from pml_rank_plugins.experiment import registry
from pml_rank_plugins.experiment.registry import UnknownNameError


def test_bare_pml_names_resolve_to_pml():
    assert registry.resolve("ContrastiveLoss") is pml_losses.ContrastiveLoss
    assert registry.resolve("FastAPLoss") is pml_losses.FastAPLoss
    from pytorch_metric_learning import miners, samplers, testers, trainers

    assert registry.resolve("TripletMarginMiner") is miners.TripletMarginMiner
    assert registry.resolve("MPerClassSampler") is samplers.MPerClassSampler
    assert registry.resolve("MetricLossOnly") is trainers.MetricLossOnly
    assert registry.resolve("GlobalEmbeddingSpaceTester") is testers.GlobalEmbeddingSpaceTester


def test_torch_and_torchvision_names():
    import torchvision

    assert registry.resolve("Adam") is torch.optim.Adam
    assert registry.resolve("StepLR") is torch.optim.lr_scheduler.StepLR
    assert registry.resolve("Identity") is torch.nn.Identity
    assert registry.resolve("Compose") is torchvision.transforms.Compose
    assert registry.resolve("resnet18") is torchvision.models.resnet18


def test_collision_bare_is_pml_prefixed_is_plugin():
    import pml_rank_plugins.losses as ours

    assert registry.resolve("FastAPLoss") is pml_losses.FastAPLoss
    assert registry.resolve("pml_rank_plugins.FastAPLoss") is ours.FastAPLoss
    assert registry.resolve("plugin:FastAPLoss") is ours.FastAPLoss
    assert registry.resolve("pml:FastAPLoss") is pml_losses.FastAPLoss
    assert ours.FastAPLoss is not pml_losses.FastAPLoss
    # A name only the plugin has resolves bare.
    assert registry.resolve("QuantizedAPLoss") is ours.QuantizedAPLoss


def test_real_collisions_follow_the_rule():
    """The names both PML and the plugin export are exactly these four; shared names stay
    PML's bare and are ours with the prefix; every other plugin name resolves bare to ours."""
    pml, ours = registry.pml_names(), registry.plugin_names()
    shared = set(pml) & set(ours)
    assert shared == {"CrossBatchMemory", "FastAPLoss", "RankedListLoss", "SelfSupervisedLoss"}
    for name in shared:
        assert registry.resolve(name) is pml[name]
        assert registry.resolve(f"plugin:{name}") is ours[name]
        assert ours[name].__module__.startswith("pml_rank_plugins.")
    only_ours = set(ours) - set(pml)
    assert {"QuantizedAPLoss", "RankedListMiner", "CategoryHardSampler"} <= only_ours
    for name in only_ours:
        assert registry.resolve(name) is ours[name]
    assert "query_gallery_split" in ours  # our own config helpers are discovered too


def test_dotted_paths():
    assert registry.resolve("torch.optim.SGD") is torch.optim.SGD
    assert registry.resolve("pytorch_metric_learning.losses.TripletMarginLoss") is (
        pml_losses.TripletMarginLoss
    )
    from pml_rank_plugins.data.splits import query_gallery_split

    assert registry.resolve("pml_rank_plugins.data.splits.query_gallery_split") is (
        query_gallery_split
    )


def test_unknown_name_lists_closest_matches():
    with pytest.raises(UnknownNameError, match="ContrastiveLoss"):
        registry.resolve("ContrastivLoss")
    with pytest.raises(UnknownNameError, match="TripletMarginLoss"):
        registry.resolve("pml:TripletMarginLos")
    with pytest.raises(UnknownNameError, match="--allow-module"):
        registry.resolve("no_such_pkg.Thing")
    with pytest.raises(UnknownNameError, match="cannot import 'torch.optim.nope'"):
        registry.resolve("torch.optim.nope.Thing")
    with pytest.raises(UnknownNameError, match="not exported by pml_rank_plugins"):
        registry.resolve("plugin:DefinitelyNotAClass")


def test_typo_hints_keep_the_namespace_the_user_wrote():
    """Issue 50: ``pml_rank_plugins.FastAPLos`` must not suggest the bare ``FastAPLoss`` (PML's
    class: following it silently swaps the implementation)."""
    cases = {
        "pml_rank_plugins.FastAPLos": "pml_rank_plugins.FastAPLoss",
        "plugin:FastAPLos": "plugin:FastAPLoss",
        "pml:FastAPLos": "pml:FastAPLoss",
        "pml_rank_plugins.losses.FastAPLos": "pml_rank_plugins.losses.FastAPLoss",
        "torch.optim.Adm": "torch.optim.Adam",
        "FastAPLos": "FastAPLoss",  # bare stays bare (PML's, by the collision rule)
    }
    for typo, hint in cases.items():
        with pytest.raises(UnknownNameError) as info:
            registry.resolve(typo)
        matches = str(info.value).split("closest matches: ")[1].split(", ")
        assert matches[0] == hint, (typo, str(info.value))
    ours = registry.resolve("pml_rank_plugins.FastAPLoss")
    assert ours.__module__.startswith("pml_rank_plugins")
    assert registry.resolve("FastAPLoss") is not ours


def test_bad_keyword_shows_signature():
    loss = pml_losses.ContrastiveLoss
    with pytest.raises(TypeError) as info:
        registry.check_keywords(loss, {"pos_margn": 0.0}, "loss_funcs.metric_loss")
    msg = str(info.value)
    assert "pos_margn" in msg and "did you mean pos_margin" in msg
    assert "signature: ContrastiveLoss(" in msg and "neg_margin" in msg
    # Keywords accepted by a base class through **kwargs are fine, and listed.
    registry.check_keywords(loss, {"distance": None, "reducer": None, "collect_stats": True})
    assert "reducer" in registry.signature_text(loss)


def test_register_user_class_and_collisions():
    class MyNet(torch.nn.Module):
        pass

    try:
        registry.register("MyNet", MyNet)
        assert registry.resolve("MyNet") is MyNet
        registry.register("MyNet", MyNet)  # same object again: fine
        with pytest.raises(ValueError, match="already resolves"):
            registry.register("ContrastiveLoss", MyNet)
        registry.register("ContrastiveLoss", MyNet, override=True)
        assert registry.resolve("ContrastiveLoss") is MyNet
        assert registry.resolve("pml:ContrastiveLoss") is pml_losses.ContrastiveLoss
    finally:
        registry.unregister("MyNet")
        registry.unregister("ContrastiveLoss")
    assert registry.resolve("ContrastiveLoss") is pml_losses.ContrastiveLoss
    with pytest.raises(TypeError):
        registry.register("x", 3)


def test_listing_shows_both_classes_of_a_shared_name():
    rows = dict(registry.listing())
    assert rows["FastAPLoss"].startswith("pytorch_metric_learning.")
    assert rows["pml_rank_plugins.FastAPLoss"] == "pml_rank_plugins.losses.fastap.FastAPLoss"
    assert rows["pml_rank_plugins.CrossBatchMemory"].startswith("pml_rank_plugins.losses")
    assert "pml_rank_plugins.QuantizedAPLoss" not in rows  # bare name is already ours
    assert rows["QuantizedAPLoss"].startswith("pml_rank_plugins.")
    for name, target in registry.listing():  # every listed name resolves to what it says
        obj = registry.resolve(name)
        assert f"{obj.__module__}.{name.rpartition('.')[2]}" == target, name
