"""Network zoo: parameter counts, output contract, vmap-compatibility, configuration errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from ldpbench.errors import ConfigError
from ldpbench.fl import network_declarations, networks
from ldpbench.fl.network_declarations import NETWORKS
from ldpbench.fl.networks import create_network

# name → (input_shape, classes, parameter count derived by hand in the network's docstring).
# Every registered network needs an entry, so a new one is put through the whole suite.
CASES = {
    "lr": ((1, 28, 28), 2, 784),
    "svm": ((784,), 2, 784),
    "softmax": ((1, 28, 28), 10, 7_850),
    "mlp": ((1, 28, 28), 10, 3_444_010),
    "lenet5": ((28, 28), 10, 61_706),
    "cnn-femnist": ((1, 28, 28), 62, 6_603_710),
    "char-lstm": ((80,), 80, 817_872),
    "resnet20": ((3, 32, 32), 10, 269_722),
    "resnet56": ((3, 32, 32), 10, 853_018),
    "resnet110": ((3, 32, 32), 10, 1_727_962),
}

# Smaller inputs for the vmap test, which runs every network in float64 twice: the ResNets take any
# image of at least 4×4 and the LSTM any window length, and the comparison does not depend on size.
VMAP_INPUT_SHAPE = {"resnet20": (3, 8, 8), "resnet56": (3, 8, 8), "resnet110": (3, 8, 8), "char-lstm": (16,)}


def case(name):
    if name not in CASES:
        pytest.fail(f"network '{name}' is registered but has no entry in CASES (shape, classes, count)")
    return CASES[name]


def parameter_count(network):
    return sum(p.numel() for p in network.parameters())


def random_inputs(name, input_shape, classes, n, generator, dtype=torch.float32):
    if name == "char-lstm":
        return torch.randint(0, classes, (n, *input_shape), generator=generator)
    return torch.randn((n, *input_shape), generator=generator, dtype=dtype)


def test_every_registered_network_has_a_case():
    assert set(NETWORKS) == set(CASES)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_parameter_count_of_default_configuration(name):
    input_shape, classes, expected = case(name)
    network = create_network(name, input_shape, classes)
    assert parameter_count(network) == expected
    # No buffers: a buffer would be state outside the stacked parameters the engine vmaps over.
    assert list(network.buffers()) == []


@pytest.mark.parametrize(("name", "input_shape", "classes", "params", "expected"), [
    ("lr", (123,), 2, {}, 123),
    ("softmax", (3, 32, 32), 10, {}, 3 * 32 * 32 * 10 + 10),
    ("mlp", (784,), 10, {"hidden": [200]}, 784 * 200 + 200 + 200 * 10 + 10),
    ("resnet20", (1, 28, 28), 10, {"in_channels": 1}, 269_434),
    ("resnet56", (28, 28), 10, {}, 852_730),
    ("resnet110", (28, 28), 10, {}, 1_727_674),
    ("char-lstm", (20,), 30, {"hidden_size": 16, "layers": 1},
     30 * 8 + (8 + 16 + 1) * 64 + 16 * 30 + 30),
])
def test_parameter_count_of_other_configurations(name, input_shape, classes, params, expected):
    assert parameter_count(create_network(name, input_shape, classes, **params)) == expected


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_output_contract(name):
    input_shape, classes, _ = case(name)
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    network = create_network(name, input_shape, classes)
    inputs = random_inputs(name, input_shape, classes, 3, generator)
    targets = torch.randint(0, classes, (3,), generator=generator)
    with torch.no_grad():
        outputs = network(inputs)
    losses = network.per_example_loss(outputs, targets)
    predictions = network.predict(outputs)
    scores = network.scores(outputs)

    assert losses.shape == (3,) and predictions.shape == (3,)
    assert predictions.dtype == torch.int64
    if network.task == "binary":
        assert outputs.shape == (3,)
        torch.testing.assert_close(scores, torch.sigmoid(outputs))
        assert torch.equal(predictions, (scores >= 0.5).to(torch.int64))
    else:
        assert network.task == "multiclass"
        assert outputs.shape == (3, classes)
        torch.testing.assert_close(losses, F.nll_loss(F.log_softmax(outputs, dim=1), targets, reduction="none"))
        torch.testing.assert_close(scores.sum(dim=1), torch.ones(3))
        assert torch.equal(predictions, scores.argmax(dim=1))


def test_logistic_loss_is_binary_cross_entropy():
    network = create_network("lr", (4,), 2)
    logits = torch.tensor([2.0, -0.5, 0.0, -3.0])
    targets = torch.tensor([1, 1, 0, 0])
    expected = F.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none")
    torch.testing.assert_close(network.per_example_loss(logits, targets), expected)


def test_hinge_loss_values():
    network = create_network("svm", (4,), 2)
    logits = torch.tensor([2.0, 0.25, -0.5, -3.0, 0.0])
    targets = torch.tensor([1, 1, 1, 0, 0])
    # s·z = 2, 0.25, -0.5, 3, 0 → max(0, 1 - s·z)
    torch.testing.assert_close(network.per_example_loss(logits, targets),
                               torch.tensor([0.0, 0.75, 1.5, 0.0, 1.0]))


@pytest.mark.parametrize("name", ["lenet5", "cnn-femnist", "resnet20"])
def test_grey_images_without_channel_axis_give_the_same_outputs(name):
    torch.manual_seed(2)
    network = create_network(name, (28, 28), 10)
    images = torch.randn(2, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(network(images), network(images.unsqueeze(1)))


@pytest.mark.parametrize("name", ["resnet20", "resnet56", "resnet110"])
@pytest.mark.parametrize("input_shape", [(1, 28, 28), (3, 32, 32)])
def test_resnets_take_grey_28_and_colour_32_images(name, input_shape):
    network = create_network(name, input_shape, 10)
    with torch.no_grad():
        outputs = network(torch.randn(1, *input_shape))
    assert outputs.shape == (1, 10) and torch.isfinite(outputs).all()


def test_char_lstm_matches_torch_lstm():
    """The hand-written cell computes what nn.LSTM computes with the same weights (gate order i, f, g, o)."""
    torch.manual_seed(3)
    network = create_network("char-lstm", (12,), 30, embedding_dim=5, hidden_size=7, layers=2).double()
    reference = nn.LSTM(5, 7, num_layers=2, batch_first=True).double()
    with torch.no_grad():
        for layer, cell in enumerate(network.cells):
            fan_in = cell.in_features - 7
            getattr(reference, f"weight_ih_l{layer}").copy_(cell.weight[:, :fan_in])
            getattr(reference, f"weight_hh_l{layer}").copy_(cell.weight[:, fan_in:])
            getattr(reference, f"bias_ih_l{layer}").copy_(cell.bias)
            getattr(reference, f"bias_hh_l{layer}").zero_()
        tokens = torch.randint(0, 30, (4, 12))
        last_hidden = reference(network.embedding(tokens))[0][:, -1]
        torch.testing.assert_close(network(tokens), network.output(last_hidden))


def test_char_lstm_forget_gate_bias_starts_at_one():
    network = create_network("char-lstm", (80,), 80)
    for cell in network.cells:
        assert torch.all(cell.bias[256:512] == 1.0)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "resnet110" else n
                                  for n in sorted(NETWORKS)])  # resnet110: about 40 s
def test_vmap_over_clients_equals_a_loop(name):
    """Per-client gradients from vmap(grad(...)) over stacked parameters equal one autograd call per client."""
    input_shape, classes, _ = case(name)
    input_shape = VMAP_INPUT_SHAPE.get(name, input_shape)
    clients, batch = 3, 2
    generator = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    network = create_network(name, input_shape, classes).double()
    base = {key: value.detach() for key, value in network.named_parameters()}
    # Each client holds its own perturbed copy, so a mix-up between clients changes the gradients.
    stacked = {key: torch.stack([value + 0.05 * client * torch.randn(value.shape, generator=generator,
                                                                      dtype=value.dtype)
                                 for client in range(clients)])
               for key, value in base.items()}
    inputs = torch.stack([random_inputs(name, input_shape, classes, batch, generator, torch.float64)
                          for _ in range(clients)])
    targets = torch.randint(0, classes, (clients, batch), generator=generator)

    def loss(params, client_inputs, client_targets):
        outputs = functional_call(network, params, (client_inputs,))
        return network.per_example_loss(outputs, client_targets).mean()

    vmapped = vmap(grad(loss))(stacked, inputs, targets)

    for client in range(clients):
        params = {key: value[client].clone().requires_grad_() for key, value in stacked.items()}
        expected = torch.autograd.grad(loss(params, inputs[client], targets[client]), list(params.values()))
        for key, value in zip(params, expected):
            torch.testing.assert_close(vmapped[key][client], value, msg=f"{name}: gradient of {key}, client {client}")
    flat = torch.cat([vmapped[key].reshape(clients, -1) for key in base], dim=1)
    assert (flat.abs().sum(dim=1) > 0).all(), "a client's gradient is zero, the comparison says nothing"
    assert not torch.allclose(flat[0], flat[1]), "clients got the same gradient"


@pytest.mark.parametrize(("name", "input_shape", "classes", "params"), [
    ("lenet5", (784,), 10, {}),
    ("lenet5", (3, 32, 32), 10, {}),
    ("cnn-femnist", (3, 32, 32), 62, {}),
    ("resnet20", (3072,), 10, {}),
    ("resnet20", (3, 32, 32), 10, {"in_channels": 1}),
    ("resnet20", (3, 32, 32), 10, {"norm_groups": 3}),
    ("resnet56", (3, 2, 2), 10, {}),
    ("char-lstm", (1, 28, 28), 80, {}),
    ("char-lstm", (80,), 80, {"hidden_size": 0}),
    ("lr", (784,), 10, {}),
    ("svm", (784,), 3, {}),
    ("mlp", (784,), 10, {"hidden": []}),
    ("mlp", (784,), 10, {"hidden": [100, -1]}),
    ("mlp", (784,), 10, {"width": 100}),
    ("softmax", (784,), 1, {}),
    ("softmax", (0, 28), 10, {}),
])
def test_incompatible_configuration_is_a_config_error(name, input_shape, classes, params):
    with pytest.raises(ConfigError, match=f"network '{name}'"):
        create_network(name, input_shape, classes, **params)


@pytest.mark.parametrize(("name", "params"), [
    ("char-lstm", {"hidden_size": 0}), ("char-lstm", {"layers": 1.0}), ("mlp", {"hidden": []}),
    ("mlp", {"hidden": "1500"}), ("mlp", {"hidden": [100, -1]}), ("mlp", {"width": 100}),
    ("resnet20", {"norm_groups": 3}), ("resnet20", {"in_channels": "3"}), ("lr", {"hidden": [10]}),
])
def test_parameters_no_input_makes_valid_are_refused_without_an_input(name, params):
    """What a campaign's validation checks before any data is loaded (ldpbench.campaign)."""
    with pytest.raises(ConfigError, match=f"network '{name}'"):
        network_declarations.check_network_params(name, params)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_every_network_accepts_its_own_defaults_without_an_input(name):
    network_declarations.check_network_params(name, network_declarations.network_parameters(name))


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_each_declaration_is_its_class(name):
    """What the workflow's parse reads without torch (ldpbench.fl.network_declarations) is what the
    network's class builds: its name, its own parameters with their defaults, its closed form, its
    fused gradients."""
    declaration = NETWORKS.get(name)
    cls = declaration.implementation_class()
    assert issubclass(cls, networks.Network) and cls.name == name
    assert network_declarations.NetworkDeclaration.of_class(cls).parameters == declaration.parameters
    assert declaration.closed_form_gradients == issubclass(cls, networks.ClosedFormGradients)
    assert declaration.fused_gradients == issubclass(cls, networks.FusedGradients)


def test_a_network_class_registered_as_it_is_is_declared_from_its_class():
    """A plugin's way: its class, its constructor's parameters and its own check_parameter."""

    class Tiny(networks.MulticlassNetwork):
        name = "tiny-for-this-test"

        def __init__(self, input_shape, classes, width: int = 3):
            super().__init__()
            self.linear = torch.nn.Linear(math.prod(input_shape), classes)

        @classmethod
        def check_parameter(cls, name, value):
            if value == 0:
                raise ConfigError(f"network '{cls.name}': {name} must not be 0")

        def forward(self, inputs):
            return self.linear(inputs.flatten(start_dim=1))

    declaration = network_declarations.NetworkDeclaration.of_class(Tiny)
    assert declaration.parameters == {"width": 3} and not declaration.closed_form_gradients
    assert not declaration.fused_gradients
    with pytest.raises(ConfigError, match="width must not be 0"):
        declaration.check_parameter("width", 0)
    assert declaration.implementation_class() is Tiny


def test_unknown_network_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown network 'lenet6'.*lenet5"):
        create_network("lenet6", (28, 28), 10)


def test_registering_a_name_twice_is_refused():
    class Duplicate(networks.MulticlassNetwork):
        name = "softmax"

        def forward(self, inputs):
            return inputs

    with pytest.raises(ValueError, match="'softmax' is registered twice"):
        network_declarations.register(Duplicate)
    assert NETWORKS.get("softmax").implementation_class() is networks.SoftmaxRegression


def test_a_network_that_declares_zero_start_trains_from_zero_whatever_its_name():
    from ldpbench.fl.model import FlatModel

    declared = {name for name in NETWORKS.names() if NETWORKS.get(name).implementation_class().zero_start}
    assert declared == {"lr", "svm", "softmax"}

    class ZeroStartMlp(networks.MultilayerPerceptron):
        zero_start = True  # a network the engine has never heard of

    seeded = networks.MultilayerPerceptron((4,), 3, hidden=[5])
    zero = ZeroStartMlp((4,), 3, hidden=[5])
    assert bool(FlatModel(seeded).starting_weights().abs().sum() > 0)
    start = FlatModel(zero).starting_weights()
    assert start.shape == (FlatModel(zero).dims,) and not bool(start.any())


def lenet_step(records, classes, dtype, seed, grey=False):
    """A LeNet-5 whose weights moved away from their start (so that relus and pools differ from
    those of a fresh network), and a batch of digit-like images with flat zero patches (ties in
    the pools) and their labels."""
    generator = torch.Generator().manual_seed(seed)
    network = create_network("lenet5", (1, 28, 28), classes).to(dtype)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator, dtype=dtype))
    images = torch.rand(records, 1, 28, 28, generator=generator, dtype=dtype)
    images = torch.where(torch.rand(images.shape, generator=generator) < 0.5, 0.0, images)
    labels = torch.randint(0, classes, (records,), generator=generator)
    return network, (images.squeeze(1) if grey else images), labels


def autograd_sums(network, images, labels):
    losses = network.per_example_loss(network(images), labels)
    return torch.autograd.grad(losses.sum(), tuple(network.parameters()))


def bits(tensor):
    return tensor.view(torch.int64 if tensor.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("records,classes,grey", [(1, 10, False), (7, 4, True), (32, 10, False), (600, 10, False)])
def test_lenet5_s_backward_written_out_gives_autograd_s_gradients_bit_for_bit(dtype, records, classes, grey):
    network, images, labels = lenet_step(records, classes, dtype, seed=records)
    written_out = network.summed_loss_gradients(images, labels)
    expected = autograd_sums(network, images, labels)
    assert written_out is not None and len(written_out) == len(expected)
    for mine, theirs, parameter in zip(written_out, expected, network.parameters(), strict=True):
        assert mine.shape == parameter.shape and mine.dtype == dtype
        assert torch.equal(bits(mine), bits(theirs))


def test_lenet5_leaves_the_backward_to_autograd_where_its_pooling_is_not_compiled(monkeypatch):
    from ldpbench.fl import pooling

    network, images, labels = lenet_step(8, 10, torch.float32, seed=1)
    assert networks.Network.summed_loss_gradients(network, images, labels) is None  # the default
    assert network.to(torch.bfloat16).summed_loss_gradients(images.to(torch.bfloat16), labels) is None
    network.to(torch.float32)
    assert network.summed_loss_gradients(images, labels) is not None
    monkeypatch.setattr(pooling, "compiled_module", lambda name: None)  # numba missing
    assert network.summed_loss_gradients(images, labels) is None
