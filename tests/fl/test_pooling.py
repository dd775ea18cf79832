"""ReLUMaxPool2d: max_pool2d(relu(x), 2)'s values and gradients bit for bit, under autograd and vmap.

The inputs are small integers with exact zeros of both signs, so that windows hold ties, all-negative
windows and −0.0 (where relu and max-pool's tie rules decide the result); a power check shows that
the data tell aten's first-maximum rule from the last-maximum one.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from ldpbench import rng
from ldpbench.fl.model import build_network
from ldpbench.fl.pooling import NUMBA_POOLING, relu_max_pool2, textbook_network


def textbook(images):
    return F.max_pool2d(F.relu(images), 2)


def last_maximum_pool(images):
    """A deliberately wrong pool for the power check: ties go to the window's last maximum."""
    return textbook(images.flip(-1, -2)).flip(-1, -2)


def tied_images(shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(-2, 3, shape, generator=generator).to(dtype)
    return torch.where(torch.rand(shape, generator=generator) < 0.1, -0.0, images)


def identical(a, b):
    """Equal values with equal signs of zero (torch.equal calls −0.0 and +0.0 equal) and NaN where NaN."""
    return (a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.signbit(), b.signbit()))


def values_and_gradient(pool, images, upstream):
    images = images.clone().requires_grad_(True)
    pooled = pool(images)
    return pooled, torch.autograd.grad(pooled, images, upstream)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 2, 6, 6), (2, 3, 7, 5), (2, 2, 5, 8), (4, 6, 28, 28), (1, 1, 2, 2)])
def test_values_and_gradients_are_max_pool_of_relus_bit_for_bit(shape, dtype):
    images = tied_images(shape, dtype)
    if shape[-2] >= 4:  # a NaN beats everything in its window and passes relu's backward
        images[0, 0, 1, 1] = float("nan")
    upstream = torch.randn(textbook(images).shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    upstream = torch.where(upstream.abs() < 0.3, -0.0, upstream)  # a −0.0 gradient becomes +0.0 in aten
    expected = values_and_gradient(textbook, images, upstream)
    fused = values_and_gradient(relu_max_pool2, images, upstream)
    assert identical(fused[0], expected[0]) and identical(fused[1], expected[1])
    if shape[-1] >= 6:  # power: the data separate the first-maximum rule from the last-maximum one
        assert not identical(values_and_gradient(last_maximum_pool, images, upstream)[1], expected[1])


def test_a_window_of_non_positive_values_gives_its_first_element_relud():
    # relu keeps −0.0 and max-pool keeps the first of equal zeros: −0.0 only where the window starts with it.
    images = torch.tensor([[[[-0.0, -1.0], [0.0, -2.0]], [[-1.0, -0.0], [0.0, -0.0]]]]).reshape(1, 2, 2, 2)
    pooled = relu_max_pool2(images)
    assert identical(pooled, textbook(images))
    assert pooled.flatten().signbit().tolist() == [True, False]


def loss(weights, images, pool):
    return (pool(F.conv2d(images, weights, padding=1)) ** 2).sum()


@pytest.mark.parametrize("in_dims", [(None, 0), (0, 0), (0, None)], ids=["shared-weights", "per-unit", "shared-images"])
def test_vmapped_gradients_equal_the_textbook_layers(in_dims):
    generator = torch.Generator().manual_seed(2)
    weights = torch.randn(5, 6, 1, 3, 3, generator=generator)
    images = tied_images((5, 4, 1, 8, 8))
    weights = weights[0] if in_dims[0] is None else weights
    images = images[0] if in_dims[1] is None else images
    gradients = {pool: vmap(grad(loss), in_dims=(*in_dims, None))(weights, images, pool)
                 for pool in (textbook, relu_max_pool2)}
    assert identical(gradients[relu_max_pool2], gradients[textbook])


def test_nested_vmaps_equal_the_textbook_layers():
    weights = torch.randn(3, 6, 1, 3, 3, generator=torch.Generator().manual_seed(3))
    images = tied_images((4, 2, 1, 8, 8))
    nested = {pool: vmap(vmap(grad(loss), in_dims=(None, 0, None)), in_dims=(0, None, None))(weights, images, pool)
              for pool in (textbook, relu_max_pool2)}
    assert identical(nested[relu_max_pool2], nested[textbook])


def test_gradients_and_second_derivatives_match_finite_differences():
    # Distinct values (no ties within the step): the pooled function is smooth there.
    images = torch.randn(2, 3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    images.requires_grad_(True)
    assert torch.autograd.gradcheck(relu_max_pool2, (images,))
    assert torch.autograd.gradgradcheck(relu_max_pool2, (images,))


def test_without_numba_and_for_other_dtypes_it_is_the_textbook_expression(monkeypatch):
    images = tied_images((2, 3, 6, 6))
    compiled = relu_max_pool2(images)
    monkeypatch.setitem(rng._COMPILED_MODULES, NUMBA_POOLING, None)
    assert identical(relu_max_pool2(images), compiled)
    half = tied_images((2, 3, 6, 6), torch.bfloat16)
    assert identical(relu_max_pool2(half).float(), textbook(half).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["compiled", "expression"])
def test_images_must_have_four_axes(dtype):
    with pytest.raises(ValueError, match=r"images \[n, C, H, W\], got shape \(3, 6, 6\)"):
        relu_max_pool2(torch.zeros(3, 6, 6, dtype=dtype))


def test_images_under_two_by_two_get_max_pool2ds_own_error():
    with pytest.raises(RuntimeError) as textbook_error:
        textbook(torch.zeros(2, 3, 6, 1))
    with pytest.raises(RuntimeError, match=re.escape(str(textbook_error.value))):
        relu_max_pool2(torch.zeros(2, 3, 6, 1))


@pytest.mark.parametrize("name, classes", [("lenet5", 10), ("cnn-femnist", 62)])
def test_the_pooling_networks_train_as_with_the_textbook_layers(name, classes):
    network = build_network(name, (1, 28, 28), classes, seed=0)
    reference = textbook_network(network)
    # Digit-like images: a zero background, where the first convolution gives its bias, so windows tie.
    generator = torch.Generator().manual_seed(5)
    images = torch.where(torch.rand(6, 1, 28, 28, generator=generator) < 0.7, 0.0,
                         torch.rand(6, 1, 28, 28, generator=generator))
    targets = torch.randint(0, classes, (6,), generator=generator)

    def gradients(model):
        losses = model.per_example_loss(model(images), targets)
        return torch.autograd.grad(losses.sum(), tuple(model.parameters()))

    assert all(identical(ours, theirs) for ours, theirs in zip(gradients(network), gradients(reference), strict=True))
