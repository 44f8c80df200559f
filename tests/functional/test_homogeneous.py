import pytest
import torch
from torch.autograd import gradcheck

from capsnets.functional import homogeneous_vector_capsules
from capsnets.layers import HomogeneousVectorCapsules
from capsnets.testing import reference_homogeneous_vector_capsules


def test_agrees_with_literal_sum_of_elementwise_products():
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        batch, children, parents, dim = (int(x) for x in torch.randint(1, 7, (4,), generator=gen))
        u = torch.randn(batch, children, dim, dtype=torch.float64, generator=gen)
        weight = torch.randn(parents, children, dim, dtype=torch.float64, generator=gen)
        expected = reference_homogeneous_vector_capsules(u, weight)
        torch.testing.assert_close(homogeneous_vector_capsules(u, weight), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(homogeneous_vector_capsules(u.float(), weight.float()), expected.float())


def test_gradcheck():
    u = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    assert gradcheck(homogeneous_vector_capsules, (u, weight))


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"u of shape \(B, I, D\)"):
        homogeneous_vector_capsules(torch.randn(5, 3), torch.randn(4, 5, 3))
    with pytest.raises(ValueError, match=r"weight of shape \(J, 5, 3\)"):
        homogeneous_vector_capsules(torch.randn(2, 5, 3), torch.randn(4, 5, 2))


def test_layer_normalises_each_component_over_batch_and_classes_then_rectifies():
    torch.manual_seed(0)
    layer = HomogeneousVectorCapsules(12, 6, 4).double()
    u = torch.randn(8, 12, 6, dtype=torch.float64)
    s = homogeneous_vector_capsules(u, layer.weight)
    mean, var = s.mean((0, 1)), s.var((0, 1), unbiased=False)
    torch.testing.assert_close(layer(u), torch.relu((s - mean) / torch.sqrt(var + 1e-3)))
    assert layer.weight.shape == (4, 12, 6) and [n for n, _ in layer.named_parameters()] == ["weight", "norm.offset"]
