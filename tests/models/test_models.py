import pytest
import torch

from pml_rank_plugins.models import ConvEmbedder, ResNetEmbedder


@pytest.mark.parametrize("normalize", [False, True])
def test_conv_embedder_shapes_and_normalization(normalize):
    model = ConvEmbedder(in_channels=1, embedding_dim=16, normalize=normalize)
    out = model(torch.randn(3, 1, 32, 32))
    assert out.shape == (3, 16)
    if normalize:
        torch.testing.assert_close(out.norm(dim=1), torch.ones(3))


def test_resnet_embedder_shapes_and_bad_depth():
    model = ResNetEmbedder(depth=18, embedding_dim=8, normalize=True, in_channels=1)
    out = model.eval()(torch.randn(2, 1, 32, 32))
    assert out.shape == (2, 8)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))
    with pytest.raises(ValueError, match="depth must be one of"):
        ResNetEmbedder(depth=34)


def test_resnet_weights_path_round_trip(tmp_path):
    import torchvision

    source = torchvision.models.resnet18(weights=None)
    torch.save(source.state_dict(), tmp_path / "r18.pt")
    model = ResNetEmbedder(depth=18, embedding_dim=4, weights_path=tmp_path / "r18.pt")
    torch.testing.assert_close(model.trunk.conv1.weight, source.conv1.weight)
    torch.save({"bogus": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="does not fit resnet18"):
        ResNetEmbedder(depth=18, weights_path=tmp_path / "bad.pt")
