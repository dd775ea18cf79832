"""Walsh–Hadamard transform and sqSGD's randomised rotation (exact identities, no statistics)."""

import math

import pytest
import torch

from ldpbench.mechanisms.hadamard import fwht, hadamard_matrix, rotate, rotation_signs, unrotate


@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 64, 256])
def test_fast_transform_agrees_with_the_dense_recursion(d):
    h = hadamard_matrix(d)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(d), dtype=torch.float64)
    torch.testing.assert_close(fwht(x), x @ h.T, rtol=0, atol=1e-10)
    if d >= 2:  # Eq. (11): H(2^m) = [[H, H], [H, −H]]
        half = hadamard_matrix(d // 2)
        torch.testing.assert_close(h, torch.cat([torch.cat([half, half], 1), torch.cat([half, -half], 1)], 0))


@pytest.mark.parametrize("d", [1, 2, 32, 512])
def test_hadamard_is_orthogonal_up_to_d(d):
    h = fwht(torch.eye(d, dtype=torch.float64))  # rows of H (H is symmetric)
    torch.testing.assert_close(h @ h.T, d * torch.eye(d, dtype=torch.float64))
    assert set(h.unique().tolist()) <= {-1.0, 1.0}


@pytest.mark.parametrize("d", [1, 16, 1024])
def test_rotation_is_orthonormal_preserves_norms_and_inverts(d):
    x = torch.randn(7, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = rotate(x, seed=3)
    torch.testing.assert_close(y.norm(dim=1), x.norm(dim=1))
    torch.testing.assert_close(unrotate(y, seed=3), x)
    if d <= 16:
        r = rotate(torch.eye(d, dtype=torch.float64), seed=3).T  # columns R·e_i
        torch.testing.assert_close(r @ r.T, torch.eye(d, dtype=torch.float64))
        dense = hadamard_matrix(d) @ torch.diag(rotation_signs(3, d)) / math.sqrt(d)
        torch.testing.assert_close(r, dense)


def test_rotation_bounds_the_infinity_norm_by_the_l2_norm():
    x = torch.zeros(1, 1024, dtype=torch.float64)
    x[0, 5] = 10.0  # the worst case for quantisation: all mass on one coordinate
    y = rotate(x, seed=0)
    assert y.abs().max() <= 10.0 and y.abs().max() == pytest.approx(10.0 / 32)


def test_public_signs_depend_only_on_the_seed_and_size():
    assert torch.equal(rotation_signs(4, 64), rotation_signs(4, 64))
    assert not torch.equal(rotation_signs(4, 64), rotation_signs(5, 64))
    assert set(rotation_signs(4, 64).unique().tolist()) == {-1.0, 1.0}


def test_each_row_is_transformed_on_its_own():
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(2))
    whole = fwht(x)
    assert torch.equal(torch.cat([fwht(x[i:i + 1]) for i in range(9)]), whole)


def test_non_power_of_two_is_refused():
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(2, 12))
