import torch

from capsnets.functional.products import matvec


def test_matvec_is_the_matrix_times_column_product_with_its_gradients():
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(3, 4, 7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    column = torch.randn(3, 4, 5, 1, generator=g, dtype=torch.float64, requires_grad=True)
    got = matvec(matrix, column)
    assert got.shape == (3, 4, 7, 1)
    torch.testing.assert_close(got, matrix @ column, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(matvec, (matrix, column))


def test_matvec_takes_transposed_views_as_the_lean_backward_passes_them():
    matrix = torch.randn(2, 6, 9, dtype=torch.float64)
    column = torch.randn(2, 6, 1, dtype=torch.float64)
    torch.testing.assert_close(matvec(matrix.mT, column), matrix.mT @ column, rtol=1e-12, atol=1e-12)
