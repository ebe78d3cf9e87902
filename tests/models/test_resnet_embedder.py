from __future__ import annotations

import pytest
import torch
import torchvision

from pml_rank_plugins import models
from pml_rank_plugins.models import ResNetEmbedder, ResNetTrunk
from tests.conftest import TEST_DEVICE


@pytest.mark.parametrize("depth,features", [(18, 512), (50, 2048)])
def test_shapes(depth, features):
    torch.manual_seed(0)
    model = ResNetEmbedder(depth=depth, embedding_dim=12).eval()
    assert model.trunk_output_size == features
    with torch.no_grad():
        assert model(torch.rand(2, 3, 32, 32)).shape == (2, 12)
        assert model(torch.rand(2, 1, 32, 32)).shape == (2, 12)  # grayscale repeated


def test_normalize_and_backward():
    torch.manual_seed(0)
    model = ResNetEmbedder(depth=18, embedding_dim=8, normalize=True)
    out = model(torch.rand(2, 3, 32, 32))
    assert torch.allclose(out.norm(dim=1), torch.ones(2), atol=1e-5)
    out.sum().backward()
    assert model.trunk.net.conv1.weight.grad is not None


@pytest.mark.parametrize("wrap", ["plain", "state_dict", "module"])
def test_weights_path_roundtrip(tmp_path, wrap):
    torch.manual_seed(1)
    source = torchvision.models.resnet18(weights=None)
    state = source.state_dict()
    if wrap == "module":
        state = {f"module.{k}": v for k, v in state.items()}
    elif wrap == "state_dict":
        state = {"state_dict": state}
    path = tmp_path / "r18.pt"
    torch.save(state, path)
    # no .to(): a model built from a weights file is on the default device whole (the test
    # device, tests/conftest.py), as one built without the file
    model = ResNetEmbedder(depth=18, embedding_dim=8, weights_path=path).eval()
    trunk = ResNetTrunk(depth=18, weights_path=path)
    for module in (model, trunk):
        devices = {t.device for t in [*module.parameters(), *module.buffers()]}
        assert devices == {torch.empty(0).device}, devices
    source.fc = torch.nn.Identity()
    source.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.trunk(x), source(x))


def test_bad_weights_and_depth(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        ResNetEmbedder(weights_path=tmp_path / "missing.pt")
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "r18.pt")
    with pytest.raises(ValueError, match="not a ResNet state dict"):
        ResNetEmbedder(depth=50, weights_path=tmp_path / "r18.pt")
    with pytest.raises(ValueError, match="depth"):
        ResNetEmbedder(depth=34)


def test_on_test_device(device):
    model = ResNetEmbedder(depth=18, embedding_dim=8).to(device).eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, 32, 32, device=device))
    assert out.device.type == device.type and out.shape == (2, 8)


def test_in_channels_stem():
    model = ResNetEmbedder(depth=18, embedding_dim=4, in_channels=1).eval()
    assert model.trunk.net.conv1.in_channels == 1
    with torch.no_grad():
        assert model(torch.rand(2, 1, 32, 32)).shape == (2, 4)


@pytest.mark.parametrize("cls", ["ResNetEmbedder", "ResNetTrunk"])
def test_a_weights_file_is_assigned_without_drawing_a_random_init(tmp_path, monkeypatch, cls):
    torch.manual_seed(2)
    state = torchvision.models.resnet18(weights=None).state_dict()
    torch.save(state, tmp_path / "r18.pt")
    drawn = []
    real = torch.nn.init.kaiming_normal_

    def spy(tensor, *args, **kwargs):  # torchvision initializes; on meta tensors nothing is drawn
        drawn.append(not tensor.is_meta)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "kaiming_normal_", spy)
    model = getattr(models, cls)(depth=18, weights_path=tmp_path / "r18.pt")
    assert drawn and not any(drawn)  # nothing drawn only to be overwritten
    net = model.trunk.net if cls == "ResNetEmbedder" else model.body.net
    tensors = dict(net.named_parameters()) | dict(net.named_buffers())
    assert not any(t.is_meta for t in tensors.values())
    # the file's tensors, loaded onto torch's default device (the test device, where `state`
    # was made too): the model is where one built without the file would be
    assert {t.device.type for t in tensors.values()} == {TEST_DEVICE.type}
    same = (torch.equal(tensors[k], v) for k, v in state.items() if not k.startswith("fc."))
    assert all(same)
    assert all(p.requires_grad and isinstance(p, torch.nn.Parameter) for p in net.parameters())
    model.to(TEST_DEVICE)  # in place: net's parameters stay the module's parameters
    model(torch.rand(2, 3, 32, 32)).sum().backward()  # trainable
    assert net.conv1.weight.grad is not None
    getattr(models, cls)(depth=18)  # without a file the random init is drawn as before
    assert any(drawn)


def test_a_file_that_lacks_a_tensor_is_refused_naming_it(tmp_path):
    state = torchvision.models.resnet18(weights=None).state_dict()
    state.pop("layer1.0.bn1.running_mean")
    torch.save(state, tmp_path / "r18.pt")
    with pytest.raises(ValueError, match="running_mean"):
        ResNetEmbedder(depth=18, weights_path=tmp_path / "r18.pt")
