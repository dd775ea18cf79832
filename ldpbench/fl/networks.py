"""Neural networks of the benchmark, written so that a whole cohort trains in one vectorised call.

The federated engine stacks per-client copies of the parameters and batches and calls
`torch.func.vmap(torch.func.grad(...))` over `torch.func.functional_call(network, params, ...)`. Every
network here is therefore a pure function of (parameters, inputs):

* no buffers and no in-place state updates in `forward` (normalisation is GroupNorm, never
  running-statistics BatchNorm);
* no `nn.LSTM`: vmap has no batching rule for its fused kernel and falls back to a slow loop over
  clients (torch 2.13 warns so); the char-LSTM writes the cell out;
* no Python branching on tensor values, only on shapes fixed at construction.

Inputs are floating point, except `char-lstm`, which takes int64 token ids [n, seq_len]. Image
networks accept [n, C, H, W] or [n, H, W] (a grey image without its channel axis); the flat networks
(`lr`, `svm`, `softmax`, `mlp`) flatten whatever trails the batch axis. Scaling uint8 pixels to [0, 1]
is the engine's job.

Targets are int64 class ids; binary networks take {0, 1} and map them to signs s = 2y − 1, as the
FedSel linear models do with their {-1, +1} labels.

What a campaign may name and set of each network (its parameters, their checks, its closed form) is
declared without torch in ldpbench.fl.network_declarations, which the workflow's parse reads; a class
here implements a declaration and is imported only by runs, when `create_network` builds it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ldpbench.errors import ConfigError
from ldpbench.fl import pooling
from ldpbench.fl.network_declarations import (
    NETWORKS,
    check_hidden_widths,
    check_network_params,
    check_recurrent_sizes,
    check_residual_sizes,
    positive_int,
    require,
)
from ldpbench.fl.pooling import ReLUMaxPool2d


class Network(nn.Module, ABC):
    """A classifier whose forward pass is a pure function of its parameters and inputs."""

    name: ClassVar[str]
    task: ClassVar[str]  # "binary" or "multiclass"
    # Training starts at w = 0 rather than at the seeded initial parameters (FedSel's linear models).
    zero_start: ClassVar[bool] = False

    @abstractmethod
    def forward(self, inputs: Tensor) -> Tensor:
        """Binary: logits [n]; multiclass: logits [n, classes]."""

    @abstractmethod
    def per_example_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Unregularised loss of every example, [n]; `targets` are int64 class ids."""

    @abstractmethod
    def predict(self, outputs: Tensor) -> Tensor:
        """Predicted class of every example, int64 [n]."""

    @abstractmethod
    def scores(self, outputs: Tensor) -> Tensor:
        """Scores for AUC: binary → P(class 1) [n]; multiclass → softmax [n, classes]."""

    @classmethod
    def has_closed_form_gradients(cls) -> bool:
        return issubclass(cls, ClosedFormGradients)

    @classmethod
    def has_fused_gradients(cls) -> bool:
        return issubclass(cls, FusedGradients)

    def summed_loss_gradients(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, ...] | None:
        """∂/∂parameters (in `parameters()` order) of the summed per-example loss over `inputs`, from a
        backward the network writes out itself, or None: the caller then asks autograd. Written out,
        it makes the calls autograd makes, in its order, so its gradients are autograd's bit for bit
        (tested), without autograd building and walking a graph of the step."""
        return None

    @classmethod
    def check_parameter(cls, name: str, value: Any) -> None:
        """Refuse (ConfigError) a value of parameter `name` that no input could make valid: a campaign's
        validation calls it before any data is loaded (through the declaration of a class registered as
        it is: a plugin's). What depends on the input shape is checked when the network is built.
        Every value passes unless a network says otherwise."""


class ClosedFormGradients(ABC):
    """What a network whose gradient has a closed form adds (the linear models): the engine then
    computes a cohort's gradients with a few matrix products instead of vmap(grad(...))."""

    @abstractmethod
    def summed_gradients(self, params: dict[str, Tensor], inputs: Tensor, targets: Tensor,
                         mask: Tensor) -> dict[str, Tensor]:
        """∂/∂params of each unit's summed loss over its unmasked examples, by formula.

        `inputs` are [units, block, ...], `targets` and `mask` [units, block]; each parameter is shared
        (its own shape) or one per unit ([units, *shape]). Returns each parameter's gradients, [units, *shape].
        """


class FusedGradients(ABC):
    """What a network adds whose written-out backward can also write its gradients scaled and added
    (training.gradients: fused): each weight gradient is a matrix product, and the product itself
    writes β·base + α·gradient (torch.addmm's beta and alpha), so a client's gradient is never written
    and read back to be scaled, added to its weights (FedAvg's step) or to l2·w (FedSGD's row). The
    same arithmetic to float rounding as the gradients scaled after, not bit for bit."""

    @abstractmethod
    def scaled_gradients_into(self, inputs: Tensor, targets: Tensor, outs: Sequence[Tensor],
                              bases: Sequence[Tensor], alpha: float, beta: float,
                              at: Sequence[Tensor] | None = None) -> None:
        """Write β·base + α·∂/∂p (the summed per-example loss over `inputs`, at the parameters `at`, by
        default the network's own) into each `out`: one out, one base and one value of `at` per
        parameter in `parameters()` order, each of its parameter's shape. An out may be its base and
        its value of `at` (an SGD step in place): a layer's weights are written only after the backward
        has read them. With β = 0 a base is not read."""


class BinaryNetwork(Network):
    task = "binary"

    @staticmethod
    def signs(targets: Tensor, dtype: torch.dtype) -> Tensor:
        return 2.0 * targets.to(dtype) - 1.0

    def predict(self, outputs: Tensor) -> Tensor:
        # z >= 0 ⇔ P(class 1) >= 1/2, the tie rule of the closed-form models' accuracy.
        return (outputs >= 0).to(torch.int64)

    def scores(self, outputs: Tensor) -> Tensor:
        return torch.sigmoid(outputs)


class MulticlassNetwork(Network):
    task = "multiclass"

    def per_example_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs, targets, reduction="none")

    def predict(self, outputs: Tensor) -> Tensor:
        return outputs.argmax(dim=1)

    def scores(self, outputs: Tensor) -> Tensor:
        return torch.softmax(outputs, dim=1)


def _summed_cross_entropy_backward(logits: Tensor, targets: Tensor) -> Tensor:
    """The gradient at `logits` of cross-entropy summed over the examples, by the calls autograd makes
    for `per_example_loss(...).sum()` (log_softmax, then nll_loss with reduction "none"), in its order:
    a written-out backward's first step, autograd's bits."""
    aten = torch.ops.aten
    log_probabilities = torch.log_softmax(logits, dim=1)
    _, total_weight = aten.nll_loss_forward(log_probabilities, targets, None, 0, -100)
    # The summed loss's gradient is one for each example's loss.
    ones = torch.ones(len(targets), dtype=log_probabilities.dtype, device=log_probabilities.device)
    grad = aten.nll_loss_backward(ones, log_probabilities, targets, None, 0, -100, total_weight)
    return aten._log_softmax_backward_data(grad, log_probabilities, 1, log_probabilities.dtype)


def create_network(name: str, input_shape: tuple[int, ...], classes: int, **params: Any) -> Network:
    """Build network `name` for examples of shape `input_shape` (no batch axis) and `classes` classes."""
    cls = NETWORKS.get(name).implementation_class()
    shape = tuple(input_shape)
    if not shape or not all(map(positive_int, shape)):
        raise ConfigError(f"network '{name}': input_shape must be a non-empty tuple of positive ints, "
                          f"got {input_shape!r}")
    if not positive_int(classes) or classes < 2:
        raise ConfigError(f"network '{name}': classes must be an int >= 2, got {classes!r}")
    check_network_params(name, params)
    return cls(input_shape=shape, classes=classes, **params)


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of an image input given as (C, H, W) or (H, W)."""
    require(len(input_shape) in (2, 3), name,
            f"expects image inputs of shape (C, H, W) or (H, W), got {input_shape}")
    return (1, *input_shape) if len(input_shape) == 2 else input_shape


def _with_channel_axis(images: Tensor) -> Tensor:
    """[n, H, W] → [n, 1, H, W]; [n, C, H, W] unchanged (the rank is fixed per network, not per value)."""
    return images.unsqueeze(1) if images.dim() == 3 else images


# --- linear models -------------------------------------------------------------------------------


class _LinearBinary(BinaryNetwork, ClosedFormGradients):
    """w·x on the flattened input, no intercept (as FedSel's linear models): d = prod(input_shape)
    parameters, e.g. 784 for a 28×28 image."""

    zero_start = True

    def __init__(self, input_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        require(classes == 2, self.name, f"is a binary classifier and needs classes = 2, got {classes}")
        self.linear = nn.Linear(math.prod(input_shape), 1, bias=False)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.linear(inputs.flatten(start_dim=1)).squeeze(1)

    @abstractmethod
    def loss_slope(self, outputs: Tensor, signs: Tensor) -> Tensor:
        """dℓ/dz of every example's loss at its output z."""

    def summed_gradients(self, params, inputs, targets, mask):
        weight = params["linear.weight"]  # [1, d], or [units, 1, d]
        x = inputs.flatten(start_dim=2)  # [units, block, d]
        outputs = (x @ weight.transpose(-1, -2)).squeeze(-1)  # one matrix product for a shared weight
        slope = self.loss_slope(outputs, self.signs(targets, x.dtype)) * mask
        # Σ over the block as a product and a sum: a batched matrix product of [1, block] × [block, d]
        # per unit costs more than the arithmetic (FedSel's units hold one record: no sum at all).
        terms = slope.unsqueeze(-1) * x  # [units, block, d]
        return {"linear.weight": terms if terms.shape[1] == 1 else terms.sum(dim=1, keepdim=True)}  # [units, 1, d]


class LogisticRegressionNetwork(_LinearBinary):
    __doc__ = "Binary logistic regression, loss softplus(−s·z). " + _LinearBinary.__doc__
    name = "lr"

    def per_example_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.softplus(-self.signs(targets, outputs.dtype) * outputs)

    def loss_slope(self, outputs: Tensor, signs: Tensor) -> Tensor:
        return -signs * torch.sigmoid(-signs * outputs)


class LinearSVMNetwork(_LinearBinary):
    __doc__ = "Linear SVM, hinge loss max(0, 1 − s·z). " + _LinearBinary.__doc__
    name = "svm"

    def per_example_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return torch.clamp(1.0 - self.signs(targets, outputs.dtype) * outputs, min=0.0)

    def loss_slope(self, outputs: Tensor, signs: Tensor) -> Tensor:
        # −s where the hinge is active; at the kink (margin exactly 1) −s as well, as autograd's clamp.
        return torch.where(1.0 - signs * outputs >= 0, -signs, 0.0)


class SoftmaxRegression(MulticlassNetwork, ClosedFormGradients):
    """Multinomial logistic regression Linear(d, classes) with bias on the flattened input.

    Parameters: d·classes + classes; MNIST (1, 28, 28), 10 classes: 784·10 + 10 = 7,850 (DiffSketch's count).
    """

    name = "softmax"
    zero_start = True

    def __init__(self, input_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), classes)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.linear(inputs.flatten(start_dim=1))

    def summed_gradients(self, params, inputs, targets, mask):
        weight, bias = params["linear.weight"], params["linear.bias"]  # [C, d], [C], or per unit
        x = inputs.flatten(start_dim=2)  # [units, block, d]
        outputs = x @ weight.transpose(-1, -2) + bias.unsqueeze(-2)  # [units, block, C]
        # Cross-entropy's gradient at the logits: softmax − one-hot.
        error = torch.softmax(outputs, dim=-1) - F.one_hot(targets, outputs.shape[-1]).to(outputs.dtype)
        error = error * mask.unsqueeze(-1)
        return {"linear.weight": error.transpose(1, 2) @ x, "linear.bias": error.sum(dim=1)}


# --- fully connected and convolutional networks --------------------------------------------------


class MultilayerPerceptron(MulticlassNetwork, FusedGradients):
    """BitRand's MLP: ReLU hidden layers (default two of 1,500 units) on the flattened input.

    Its backward is written out (`summed_loss_gradients`, autograd's gradients bit for bit), and also
    fused into the products that make its weight gradients (`scaled_gradients_into`).

    Parameters for MNIST (1, 28, 28), 10 classes, hidden [1500, 1500]:
    (784·1500 + 1500) + (1500·1500 + 1500) + (1500·10 + 10) = 1,177,500 + 2,251,500 + 15,010 = 3,444,010.
    """

    name = "mlp"

    def __init__(self, input_shape: tuple[int, ...], classes: int, hidden: Sequence[int] = (1500, 1500)) -> None:
        super().__init__()
        check_hidden_widths(self.name, "hidden", hidden)
        widths = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = []
        for fan_in, fan_out in pairwise(widths):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.layers(inputs.flatten(start_dim=1))

    def _backward(self, inputs: Tensor, targets: Tensor,
                  at: Sequence[Tensor] | None = None) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(layer's position, the summed loss's gradient at its output, its input), from the last
        layer to the first, at the parameters `at` ((weight, bias) of each layer; by default the
        network's own), each the call autograd makes (`LeNet5.summed_loss_gradients`); the caller
        holds `torch.no_grad()`. The gradient at a layer's input is computed from its weights before
        the layer is yielded, so the caller may then change them."""
        aten = torch.ops.aten
        layers = tuple(self.parameters()) if at is None else tuple(at)
        weights, biases = layers[::2], layers[1::2]
        layer_inputs = [inputs.flatten(start_dim=1)]
        for weight, bias in zip(weights[:-1], biases[:-1]):
            layer_inputs.append(torch.addmm(bias, layer_inputs[-1], weight.t()).relu_())
        grad = _summed_cross_entropy_backward(torch.addmm(biases[-1], layer_inputs[-1], weights[-1].t()), targets)
        for index in range(len(weights) - 1, -1, -1):
            below = None if index == 0 else aten.threshold_backward(grad.mm(weights[index]), layer_inputs[index], 0)
            yield index, grad, layer_inputs[index]
            grad = below

    def summed_loss_gradients(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, ...]:
        """Autograd's gradients bit for bit (torch's addmm backward for a transposed weight: `grad.mm(weight)`,
        `grad.t().mm(input)`, `grad.sum(0)`; relu's `threshold_backward` on its result), without a graph."""
        gradients = [None] * len(self.layers[::2])
        with torch.no_grad():
            for index, grad, layer_input in self._backward(inputs, targets):
                gradients[index] = grad.t().mm(layer_input), grad.sum(0)
        return tuple(tensor for pair in gradients for tensor in pair)

    def scaled_gradients_into(self, inputs: Tensor, targets: Tensor, outs: Sequence[Tensor],
                              bases: Sequence[Tensor], alpha: float, beta: float,
                              at: Sequence[Tensor] | None = None) -> None:
        with torch.no_grad():
            ones = None
            for index, grad, layer_input in self._backward(inputs, targets, at):
                weight, bias = 2 * index, 2 * index + 1
                torch.addmm(bases[weight], grad.t(), layer_input, beta=beta, alpha=alpha, out=outs[weight])
                if ones is None:
                    ones = torch.ones(len(grad), dtype=grad.dtype, device=grad.device)
                # The bias's gradient, the sum over the examples, as one product too.
                torch.addmv(bases[bias], grad.t(), ones, beta=beta, alpha=alpha, out=outs[bias])


class LeNet5(MulticlassNetwork):
    """LeNet-5 in its common modern form for 28×28 grey images (as in the PyTorch/d2l tutorials).

    conv5×5 6 (padding 2, so 28×28 plays LeCun's 32×32) → ReLU → max-pool 2 → conv5×5 16 → ReLU →
    max-pool 2 → fc 400→120 → ReLU → fc 120→84 → ReLU → fc 84→classes. Full C3 connectivity, no
    normalisation. Parameters for 10 classes:
    156 + 2,416 + 48,120 + 10,164 + 850 = 61,706.

    sqSGD quotes 119,850 parameters for its LeNet without giving the layer sizes; no standard layout
    (1 or 3 input channels, 3×3 or 5×5 kernels, 6–32 / 16–64 channels, common fc widths, with or
    without biases) reproduces that number, so we keep the textbook LeNet-5 and its 61,706.
    """

    name = "lenet5"

    def __init__(self, input_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        require(_image_shape(self.name, input_shape) == (1, 28, 28), self.name,
                f"expects 28×28 grey images, input shape (1, 28, 28) or (28, 28), got {input_shape}")
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5, padding=2), ReLUMaxPool2d(),
            nn.Conv2d(6, 16, kernel_size=5), ReLUMaxPool2d(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, classes),
        )

    def forward(self, inputs: Tensor) -> Tensor:
        return self.classifier(self.features(_with_channel_axis(inputs)).flatten(start_dim=1))

    def summed_loss_gradients(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, ...] | None:
        """The backward of cross-entropy summed over `inputs`, written out (Network.summed_loss_gradients)
        where the pooling compiles: in a client step of a few dozen images, autograd's own work (building
        and walking the graph) is a large part of the time. Each call is the one autograd makes for this
        graph: the convolutions' `convolution_backward` (no input gradient for the images), a linear
        layer's `grad.mm(weight)`, `grad.t().mm(input)` and `grad.sum(0)` (torch's addmm backward for a
        transposed weight), relu's `threshold_backward` on its result."""
        images = _with_channel_axis(inputs)
        if not pooling.compiles(images):
            return None
        conv1, _, conv2, _ = self.features
        fc1, _, fc2, _, fc3 = self.classifier
        aten = torch.ops.aten

        def geometry(conv):  # stride, padding, dilation, transposed, output padding, groups
            return list(conv.stride), list(conv.padding), list(conv.dilation), False, [0, 0], conv.groups

        with torch.no_grad():
            first = aten.convolution(images, conv1.weight, conv1.bias, *geometry(conv1))
            pooled1, index1 = pooling.pooled_with_index(first)
            second = aten.convolution(pooled1, conv2.weight, conv2.bias, *geometry(conv2))
            pooled2, index2 = pooling.pooled_with_index(second)
            flat = pooled2.flatten(start_dim=1)
            hidden1 = torch.addmm(fc1.bias, flat, fc1.weight.t()).relu()
            hidden2 = torch.addmm(fc2.bias, hidden1, fc2.weight.t()).relu()
            grad = _summed_cross_entropy_backward(torch.addmm(fc3.bias, hidden2, fc3.weight.t()), targets)
            grad_fc3 = grad.t().mm(hidden2), grad.sum(0)
            grad = aten.threshold_backward(grad.mm(fc3.weight), hidden2, 0)
            grad_fc2 = grad.t().mm(hidden1), grad.sum(0)
            grad = aten.threshold_backward(grad.mm(fc2.weight), hidden1, 0)
            grad_fc1 = grad.t().mm(flat), grad.sum(0)
            grad = pooling.pooled_backward(grad.mm(fc1.weight).view_as(pooled2), pooled2, index2,
                                           *second.shape[-2:])
            grad, *grad_conv2 = aten.convolution_backward(grad, pooled1, conv2.weight, [conv2.out_channels],
                                                          *geometry(conv2), [True, True, True])
            grad = pooling.pooled_backward(grad, pooled1, index1, *first.shape[-2:])
            _, *grad_conv1 = aten.convolution_backward(grad, images, conv1.weight, [conv1.out_channels],
                                                       *geometry(conv1), [False, True, True])
        return (*grad_conv1, *grad_conv2, *grad_fc1, *grad_fc2, *grad_fc3)


class FemnistCNN(MulticlassNetwork):
    """The LEAF FEMNIST CNN for 28×28 grey images.

    conv5×5 32 ('same') → ReLU → max-pool 2 → conv5×5 64 ('same') → ReLU → max-pool 2 →
    fc 3136→2048 → ReLU → fc 2048→classes. Parameters for 62 classes:
    832 + 51,264 + 6,424,576 + 127,038 = 6,603,710.
    """

    name = "cnn-femnist"

    def __init__(self, input_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        require(_image_shape(self.name, input_shape) == (1, 28, 28), self.name,
                f"expects 28×28 grey images, input shape (1, 28, 28) or (28, 28), got {input_shape}")
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=5, padding=2), ReLUMaxPool2d(),
            nn.Conv2d(32, 64, kernel_size=5, padding=2), ReLUMaxPool2d(),
        )
        self.classifier = nn.Sequential(nn.Linear(64 * 7 * 7, 2048), nn.ReLU(), nn.Linear(2048, classes))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.classifier(self.features(_with_channel_axis(inputs)).flatten(start_dim=1))


# --- recurrent network ---------------------------------------------------------------------------


class CharLSTM(MulticlassNetwork):
    """LEAF's Shakespeare model: next character from the last hidden state of a character window.

    Input: int64 token ids [n, seq_len] (LEAF: seq_len 80) in [0, classes); the vocabulary is the class
    set (LEAF: 80 symbols, its unknown/padding ids included). embedding 8 → two stacked LSTM layers of
    256 → fc 256→classes on the last time step.

    Each LSTM layer is one Linear on [x_t, h_{t−1}] giving the four gates, with one bias vector per
    gate as in TensorFlow's BasicLSTMCell that LEAF uses (nn.LSTM would have two bias vectors).
    The forget-gate bias starts at 1, the value BasicLSTMCell adds as its fixed forget_bias.
    Zero initial states. Parameters for 80 classes:
    embedding 80·8 = 640; layer 1 (8+256+1)·1024 = 271,360; layer 2 (256+256+1)·1024 = 525,312;
    output 256·80 + 80 = 20,560; total 817,872.
    """

    name = "char-lstm"

    def __init__(self, input_shape: tuple[int, ...], classes: int, embedding_dim: int = 8,
                 hidden_size: int = 256, layers: int = 2) -> None:
        super().__init__()
        require(len(input_shape) == 1, self.name,
                f"expects token-id windows of shape (seq_len,), got {input_shape}")
        for field, value in (("embedding_dim", embedding_dim), ("hidden_size", hidden_size), ("layers", layers)):
            check_recurrent_sizes(self.name, field, value)
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(classes, embedding_dim)
        self.cells = nn.ModuleList(
            nn.Linear((embedding_dim if layer == 0 else hidden_size) + hidden_size, 4 * hidden_size)
            for layer in range(layers)
        )
        with torch.no_grad():
            for cell in self.cells:
                cell.bias[hidden_size:2 * hidden_size].fill_(1.0)  # gate order: input, forget, cell, output
        self.output = nn.Linear(hidden_size, classes)

    def forward(self, inputs: Tensor) -> Tensor:
        embedded = self.embedding(inputs)  # [n, seq_len, embedding_dim]
        zeros = embedded.new_zeros(inputs.shape[0], self.hidden_size)
        hidden = [zeros] * len(self.cells)
        memory = [zeros] * len(self.cells)
        for step in range(inputs.shape[1]):
            layer_input = embedded[:, step]
            for layer, cell in enumerate(self.cells):
                input_gate, forget_gate, cell_gate, output_gate = cell(
                    torch.cat([layer_input, hidden[layer]], dim=1)).chunk(4, dim=1)
                memory[layer] = (torch.sigmoid(forget_gate) * memory[layer]
                                 + torch.sigmoid(input_gate) * torch.tanh(cell_gate))
                hidden[layer] = torch.sigmoid(output_gate) * torch.tanh(memory[layer])
                layer_input = hidden[layer]
        return self.output(hidden[-1])


# --- CIFAR ResNets -------------------------------------------------------------------------------


class _ResidualBlock(nn.Module):
    """Two 3×3 convolutions with GroupNorm; option-A shortcut (subsample, then zero-pad channels)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm_groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(norm_groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(norm_groups, out_channels)
        self.stride = stride
        self.extra_channels = out_channels - in_channels

    def forward(self, inputs: Tensor) -> Tensor:
        shortcut = inputs[..., ::self.stride, ::self.stride]
        if self.extra_channels:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.extra_channels))
        residual = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(inputs)))))
        return F.relu(residual + shortcut)


class _CifarResNet(MulticlassNetwork):
    """He et al. (2016, §4.2) CIFAR ResNet with 6n+2 layers: a 3×3 conv of 16 channels, three stages of
    n residual blocks with 16/32/64 channels (the 2nd and 3rd start with stride 2), global average
    pooling, fc 64→classes. Shortcuts are option A (identity; on a stage change, stride-2 subsampling
    and zero channels), so shortcuts add no parameters, as in the paper's CIFAR experiments.

    Normalisation is GroupNorm (default 2 groups) instead of BatchNorm: running statistics would be
    in-place state updates that vmap cannot batch, and BatchNorm without them makes a prediction
    depend on the rest of the batch and is ill-posed for a client's tiny local batches; GroupNorm is
    per-example and is the usual replacement in FL (Hsieh et al. 2020; Reddi et al. 2021). Its affine
    parameters are as many as BatchNorm's, so the counts match the BatchNorm ResNets'.

    Input: images of any size of at least 4×4 ([n, C, H, W] or [n, H, W]; C = in_channels, derived
    from input_shape), e.g. 28×28 grey (Fashion-MNIST) or 32×32 colour (CIFAR-10).
    """

    blocks_per_stage: ClassVar[int]

    def __init__(self, input_shape: tuple[int, ...], classes: int, in_channels: int | None = None,
                 norm_groups: int = 2) -> None:
        super().__init__()
        channels, height, width = _image_shape(self.name, input_shape)
        require(height >= 4 and width >= 4, self.name, f"needs images of at least 4×4, got {input_shape}")
        check_residual_sizes(self.name, "in_channels", in_channels)
        require(in_channels is None or in_channels == channels, self.name,
                f"in_channels = {in_channels!r} contradicts input shape {input_shape}")
        check_residual_sizes(self.name, "norm_groups", norm_groups)
        self.stem = nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1, bias=False),
                                  nn.GroupNorm(norm_groups, 16), nn.ReLU())
        blocks = []
        width_in = 16
        for stage, width_out in enumerate((16, 32, 64)):
            for block in range(self.blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                blocks.append(_ResidualBlock(width_in, width_out, stride, norm_groups))
                width_in = width_out
        self.blocks = nn.Sequential(*blocks)
        self.classifier = nn.Linear(64, classes)

    def forward(self, inputs: Tensor) -> Tensor:
        features = self.blocks(self.stem(_with_channel_axis(inputs)))
        return self.classifier(features.mean(dim=(2, 3)))


class ResNet20(_CifarResNet):
    __doc__ = (_CifarResNet.__doc__ + "\n    ResNet-20 (n = 3). Parameters for 10 classes: 269,722 with 3 input "
               "channels, 269,434 with 1.\n")
    name = "resnet20"
    blocks_per_stage = 3


class ResNet56(_CifarResNet):
    __doc__ = (_CifarResNet.__doc__ + "\n    ResNet-56 (n = 9). Parameters for 10 classes: 853,018 with 3 input "
               "channels, 852,730 with 1.\n")
    name = "resnet56"
    blocks_per_stage = 9


class ResNet110(_CifarResNet):
    __doc__ = (_CifarResNet.__doc__ + "\n    ResNet-110 (n = 18). Parameters for 10 classes: 1,727,962 with 3 "
               "input channels, 1,727,674 with 1.\n")
    name = "resnet110"
    blocks_per_stage = 18

