"""CapsPix2pix and pix2pix generators, the PatchGAN discriminator, silhouette label maps, and the
pix2pix training step (Bass et al. 2019; Isola et al. 2017)."""

import pytest
import torch

import capsnets
from capsnets.experiments.synthesis import silhouette_label_maps, synthesis_errors, train_pix2pix
from capsnets.models import PatchDiscriminator


def test_registered_generators():
    assert capsnets.list_models(task="synthesis") == ["capspix2pix", "capspix2pix_small", "pix2pix", "pix2pix_small"]
    caps = capsnets.create_model("capspix2pix")
    # the SegCaps R3 trunk (1,416,112 parameters with one input channel; 10 label channels add 9 x 5 x 5 x 16)
    assert capsnets.count_parameters(caps.trunk) == 1_416_112 + 9 * 25 * 16
    assert capsnets.count_parameters(caps) == 1_429_249


@pytest.mark.parametrize("name", ["capspix2pix_small", "pix2pix_small"])
def test_generators_map_label_maps_to_images_and_train(name):
    torch.manual_seed(0)
    generator = capsnets.create_model(name, input_size=(3, 16, 16))
    maps = torch.zeros(2, 3, 16, 16)
    maps[0, 1, 4:12, 4:12] = 1
    out = generator(maps)
    assert out.images.shape == (2, 1, 16, 16) and ((out.images >= 0) & (out.images <= 1)).all()
    if name.startswith("caps"):
        assert out.capsules.shape == (2, 8, 16, 16)
        torch.testing.assert_close(generator.decode(out.capsules), out.images)
    else:
        assert out.capsules is None
    out.images.mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in generator.parameters())


def test_patch_discriminator_scores_patches_of_the_pair():
    disc = PatchDiscriminator(4, width=8)
    logits = disc(torch.rand(2, 3, 32, 32), torch.rand(2, 1, 32, 32))
    assert logits.shape == (2, 1, 7, 7)
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        PatchDiscriminator(4, stages=0)


def test_silhouette_label_maps():
    images = torch.zeros(3, 1, 4, 4)
    images[0, 0, 1:3, 1:3] = 0.5
    images[1, 0, 0, 0] = 0.04  # below the threshold
    images[2, 0, 3, 3] = 1.0
    maps, padded = silhouette_label_maps(images, torch.tensor([2, 0, 1]), 3, size=6)
    assert maps.shape == (3, 3, 6, 6) and padded.shape == (3, 1, 6, 6)
    assert torch.equal(padded[:, :, 1:5, 1:5], images)  # centred
    assert maps[0, 2].sum() == 4 and maps[0, 2, 2:4, 2:4].all() and maps[0, :2].sum() == 0
    assert maps[1].sum() == 0 and maps[2, 1, 4, 4] == 1
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        silhouette_label_maps(images, torch.tensor([0, 1, 3]), 3)
    with pytest.raises(ValueError, match="smaller than the images"):
        silhouette_label_maps(images, torch.tensor([0, 1, 2]), 3, size=3)


def test_train_pix2pix_updates_both_networks_and_reports_its_losses():
    torch.manual_seed(0)
    generator = capsnets.create_model("pix2pix_small", input_size=(2, 16, 16))
    disc = PatchDiscriminator(3, width=4)
    maps = (torch.rand(8, 2, 16, 16) > 0.5).float()
    images = torch.rand(8, 1, 16, 16)
    g0, d0 = [p.clone() for p in generator.parameters()], [p.clone() for p in disc.parameters()]
    history = train_pix2pix(generator, disc, maps, images, epochs=2, batch_size=4, progress=False)
    assert [r["epoch"] for r in history] == [1, 2] and all(r["l1"] > 0 and r["discriminator"] > 0 for r in history)
    assert any(not torch.equal(a, b) for a, b in zip(g0, generator.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(d0, disc.parameters()))


def test_synthesis_errors_of_a_perfect_and_a_blank_generator():
    from capsnets.models import SynthesisOutput

    images = torch.rand(5, 1, 4, 4)

    class Copy(torch.nn.Module):
        def forward(self, maps):
            return SynthesisOutput(maps)

    perfect = synthesis_errors(Copy(), images, images)
    assert perfect["l1"] == 0 and perfect["psnr"] == pytest.approx(100.0)  # MSE floored at 1e-10
    blank = synthesis_errors(Copy(), torch.zeros_like(images), images)
    assert blank["l1"] == pytest.approx(images.mean().item())
