"""`ReLUMaxPool2d`: ReLU then a 2×2 max-pool of stride 2, the pair every convolution of LeNet-5 and the
FEMNIST CNN ends with, computed in one compiled pass each way where it can be.

On CPU in float32 and float64 the pair runs through ldpbench.fl.numba_pooling's kernels; its values
and gradients are `max_pool2d(relu(x), 2)`'s bit for bit, ties, −0.0 and NaN included (the kernels'
docstrings say how). Everywhere else (CUDA, other dtypes, numba missing) it is that expression.

The networks train under `torch.func.vmap(torch.func.grad(...))` as well as plain autograd, so both
autograd functions here carry a vmap rule: pooling is per plane, so a vmapped batch is more planes.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ldpbench.rng import compiled_module

NUMBA_POOLING = "ldpbench.fl.numba_pooling"  # loaded at the first compiled pooling (compiled_module)
_KERNEL_DTYPES = (torch.float32, torch.float64)


def relu_max_pool2(inputs: Tensor) -> Tensor:
    """max_pool2d(relu(inputs), 2) of images [n, C, H, W]."""
    if inputs.dim() != 4:
        raise ValueError(f"relu_max_pool2 takes images [n, C, H, W], got shape {tuple(inputs.shape)}")
    if not compiles(inputs):
        return F.max_pool2d(F.relu(inputs), 2)
    return _ReLUMaxPool2.apply(inputs)[0]


def compiles(images: Tensor) -> bool:
    """Whether relu_max_pool2 pools `images` [n, C, H, W] with the compiled kernels (else: the expression)."""
    return (images.device.type == "cpu" and images.dtype in _KERNEL_DTYPES
            and min(images.shape[-2:]) >= 2  # (images under 2×2: max_pool2d's own error)
            and compiled_module(NUMBA_POOLING) is not None)


def pooled_with_index(images: Tensor) -> tuple[Tensor, Tensor]:
    """relu_max_pool2's forward outside autograd, where it `compiles`: (pooled, the index of the element
    each output came from), what its backward takes (a network's backward written by hand)."""
    return _ReLUMaxPool2.forward(images)


def pooled_backward(grad_pooled: Tensor, pooled: Tensor, index: Tensor, height: int, width: int) -> Tensor:
    """relu_max_pool2's backward outside autograd: the gradient at images of height × width."""
    return _ReLUMaxPool2Backward.forward(grad_pooled, pooled, index, height, width)


class ReLUMaxPool2d(nn.Module):
    """nn.ReLU() followed by nn.MaxPool2d(2), as one module (relu_max_pool2)."""

    def forward(self, inputs: Tensor) -> Tensor:
        return relu_max_pool2(inputs)


def textbook_network(network: nn.Module) -> nn.Module:
    """A copy of `network` with each ReLUMaxPool2d written out as nn.ReLU() then nn.MaxPool2d(2): the same
    parameters and function in plain PyTorch layers (what the benchmarks' references train)."""
    textbook = copy.deepcopy(network)
    for module in list(textbook.modules()):
        for name, child in module.named_children():
            if isinstance(child, ReLUMaxPool2d):
                setattr(module, name, nn.Sequential(nn.ReLU(), nn.MaxPool2d(2)))
    return textbook


def _planes(images: Tensor):
    """[n, C, H, W] → a numpy view of its contiguous flat planes [n·C, H·W] (what the kernels take): of
    the tensor's own memory for the outputs, which are allocated contiguous."""
    return images.detach().contiguous().view(-1, images.shape[-2] * images.shape[-1]).numpy()


def _batch_first(tensor: Tensor, batch_dim: int | None, size: int) -> Tensor:
    """A vmapped argument with its batch axis first (an unbatched one repeated `size` times)."""
    return tensor.movedim(batch_dim, 0) if batch_dim is not None else tensor.expand(size, *tensor.shape)


class _ReLUMaxPool2(torch.autograd.Function):
    """images [n, C, H, W] → (pooled [n, C, H//2, W//2], index int64 of the same shape: the position
    h·W + w in its plane of the element each output came from, as max_pool2d_with_indices gives)."""

    @staticmethod
    def forward(images: Tensor) -> tuple[Tensor, Tensor]:
        n, channels, height, width = images.shape
        pooled = images.new_empty(n, channels, height // 2, width // 2)
        index = torch.empty(pooled.shape, dtype=torch.int64)
        kernels = compiled_module(NUMBA_POOLING)
        planes = _planes(images)
        if width % 2 == 0:  # each window's halves are adjacent pairs of values: the vectorised kernel
            pairs = planes.view(np.complex64 if planes.dtype == np.float32 else np.complex128)
            kernels.relu_max_pool2_forward_pairs(pairs, width, _planes(pooled), _planes(index), width // 2)
        else:
            kernels.relu_max_pool2_forward(planes, width, _planes(pooled), _planes(index), width // 2)
        return pooled, index

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pooled, index = output
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(pooled, index)
        ctx.image_shape = inputs[0].shape[-2:]

    @staticmethod
    def backward(ctx, grad_pooled: Tensor, _grad_index: Tensor | None) -> Tensor:
        pooled, index = ctx.saved_tensors
        return _ReLUMaxPool2Backward.apply(grad_pooled, pooled, index, *ctx.image_shape)

    @staticmethod
    def vmap(info, in_dims, images):
        batched = images.movedim(in_dims[0], 0)
        pooled, index = _ReLUMaxPool2.apply(batched.flatten(0, 1))
        size = batched.shape[:2]
        return (pooled.unflatten(0, size), index.unflatten(0, size)), (0, 0)


class _ReLUMaxPool2Backward(torch.autograd.Function):
    """The gradient at the images from the gradient at the pooled outputs (relu_max_pool2_backward)."""

    @staticmethod
    def forward(grad_pooled: Tensor, pooled: Tensor, index: Tensor, height: int, width: int) -> Tensor:
        grad_images = grad_pooled.new_empty(*grad_pooled.shape[:-2], height, width)
        kernels = compiled_module(NUMBA_POOLING)
        kernels.relu_max_pool2_backward(_planes(grad_pooled), _planes(pooled), _planes(index), _planes(grad_images))
        return grad_images

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, pooled, index, _, _ = inputs
        ctx.save_for_backward(pooled, index)

    @staticmethod
    def backward(ctx, grad_grad_images: Tensor):
        # The backward is linear in grad_pooled: its own gradient gathers back what each output sent.
        pooled, index = ctx.saved_tensors
        gathered = grad_grad_images.flatten(-2).gather(-1, index.flatten(-2)).view_as(pooled)
        return torch.where(pooled <= 0, 0.0, gathered), None, None, None, None

    @staticmethod
    def vmap(info, in_dims, grad_pooled, pooled, index, height, width):
        args = [_batch_first(tensor, dim, info.batch_size).flatten(0, 1)
                for tensor, dim in zip((grad_pooled, pooled, index), in_dims[:3])]
        grad_images = _ReLUMaxPool2Backward.apply(*args, height, width)
        return grad_images.unflatten(0, (info.batch_size, -1)), 0
