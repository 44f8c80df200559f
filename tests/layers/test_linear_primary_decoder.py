import pytest
import torch

from capsnets.functional import squash
from capsnets.layers import CapsuleDecoder, LinearCapsules, PrimaryCapsules


def test_primary_capsules_shape_order_and_squash():
    layer = PrimaryCapsules(4, 3, 5, kernel_size=3, stride=2, dtype=torch.float64)
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64)
    out = layer(x)
    assert out.shape == (2, 3 * 4 * 4, 5) and layer.num_capsules(9, 9) == 48
    maps = layer.conv(x).view(2, 3, 5, 4, 4)  # capsule (type t, row y, col x) = maps[:, t, :, y, x]
    torch.testing.assert_close(out[:, 1 * 16 + 2 * 4 + 3], squash(maps[:, 1, :, 2, 3]))


def test_linear_capsules_predictions_match_einsum():
    layer = LinearCapsules(7, 4, 3, 5, dtype=torch.float64)
    u = torch.randn(2, 7, 4, dtype=torch.float64)
    expected = torch.einsum("ijed,bid->bije", layer.weight, u)
    torch.testing.assert_close(layer.predictions(u), expected)
    assert layer(u).shape == (2, 3, 5)
    v, c = layer(u, return_couplings=True)
    assert c.shape == (2, 7, 3)


def test_linear_capsules_takes_routing_value():
    calls = []

    def routing(u_hat, **kwargs):
        calls.append(u_hat.shape)
        return u_hat.mean(dim=1)

    layer = LinearCapsules(6, 2, 4, 3, routing=routing)
    assert layer(torch.randn(5, 6, 2)).shape == (5, 4, 3)
    assert calls == [torch.Size([5, 6, 4, 3])]
    assert "DynamicRouting(iterations=3" in repr(LinearCapsules(6, 2, 4, 3))


def test_decoder_masks_all_but_selected():
    dec = CapsuleDecoder(3, 4, (1, 5, 5), hidden=(8,))
    caps = torch.randn(2, 3, 4)
    out = dec(caps, torch.tensor([0, 2]))
    assert out.shape == (2, 1, 5, 5) and (out >= 0).all() and (out <= 1).all()
    changed = caps.clone()
    changed[:, 1] += 10  # a masked capsule: no effect
    torch.testing.assert_close(dec(changed, torch.tensor([0, 2])), out)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: PrimaryCapsules(0, 3, 5), "in_channels"),
        (lambda: PrimaryCapsules(4, 3, 5, stride=0), "stride"),
        (lambda: LinearCapsules(7, 4, -3, 5), "out_capsules"),
        (lambda: LinearCapsules(7, 4, 3, 5, init_std=0), "init_std"),
        (lambda: CapsuleDecoder(3, 4, (5, 5)), "output_shape"),
    ],
)
def test_bad_sizes_raise_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_wrong_input_shapes():
    with pytest.raises(ValueError, match=r"\(B, 7, 4\)"):
        LinearCapsules(7, 4, 3, 5)(torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match=r"\(B, 4, H, W\)"):
        PrimaryCapsules(4, 3, 5)(torch.randn(2, 3, 20, 20))
    with pytest.raises(ValueError, match="smaller"):
        PrimaryCapsules(4, 3, 5, kernel_size=9).num_capsules(5, 5)
