"""The evaluation's sets converted to the working dtype once (ldpbench.fl.metrics.Evaluator)."""

import math

import pytest
import torch

from ldpbench.fl import metrics
from ldpbench.fl.metrics import Evaluator
from ldpbench.fl.model import FlatModel
from ldpbench.fl.networks import create_network

# (network, input shape, classes, the sets' features, working dtype): tabular float32 records trained in
# float64, uint8 images (as_inputs scales them to [0, 1]) and token ids (kept as they are).
CASES = {
    "lr": ((20,), 2, lambda n: torch.randn(n, 20), torch.float64),
    "lenet5": ((28, 28), 10, lambda n: torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8), torch.float32),
    "char-lstm": ((12,), 30, lambda n: torch.randint(0, 30, (n, 12)), torch.float32),
}


def evaluator(name: str) -> tuple[Evaluator, torch.Tensor]:
    input_shape, classes, features, dtype = CASES[name]
    torch.manual_seed(3)
    model = FlatModel(create_network(name, input_shape, classes))
    labels = lambda n: torch.randint(0, classes, (n,))  # noqa: E731
    evaluate = Evaluator(model, features(70), labels(70), features(90), labels(90), 1e-3, dtype,
                         features(50), labels(50))
    weights = (model.starting_weights() + 0.01 * torch.randn(model.dims)).to(dtype)
    return evaluate, weights


@pytest.mark.parametrize("name", CASES)
def test_sets_converted_once_give_the_metrics_of_sets_converted_a_batch_at_a_time(monkeypatch, name):
    """Bit for bit, in batches smaller than the sets (several per set)."""
    outputs, batches = Evaluator.outputs, []
    monkeypatch.setattr(Evaluator, "outputs", lambda self, weights, features: batches.append(len(features))
                        or outputs(self, weights, features, batch=32))
    once, weights = evaluator(name)
    monkeypatch.setattr(metrics, "CONVERTED_ONCE_BYTES", 0)
    per_batch, _ = evaluator(name)
    kept = {"lr": torch.float64, "lenet5": torch.float32, "char-lstm": torch.int64}[name]
    assert once.train_features.dtype == once.sets["test"][0].dtype == once.sets["validation"][0].dtype == kept
    # Power: without room for a converted copy, the sets stay as they were given.
    assert per_batch.sets["test"][0].dtype == CASES[name][2](1).dtype
    a, b = once(weights), per_batch(weights)
    assert a.keys() == b.keys() and all(math.isfinite(value) for value in a.values())
    assert all(a[key] == b[key] for key in a)
    assert batches == [70, 90, 50] * 2  # every set evaluated, each in batches of 32 records
