"""training.gradients: fused changes the MLP's last bits; its accuracies must keep their distribution.

Fused, the product that makes each weight gradient also scales it and adds it where it goes (FedSGD's
row with l2·w, FedAvg's local step into the weights), so the rounding differs from the per-client
arithmetic's, which computes the gradient, then scales and adds it. That is a versioned change: the
run summary's `gradients` column says which arithmetic ran, and `training.gradients: per-client`
gives the numbers `auto` gave before. Equal to float rounding in a step
(tests/fl/test_federated.py), the two can still part over rounds, as any trajectory does under a
change of rounding. This test trains the same seeds both ways, long enough for that to happen (a seed
can end a few points apart), and asks that the final test accuracies be equivalent: the paired
differences' two one-sided t-tests (Schuirmann's TOST) each reject a mean difference of at least
MARGIN at level ALPHA, i.e. the (1 − 2·ALPHA) interval of the mean difference lies within ±MARGIN.
ALPHA bounds the chance of passing a change that moves the mean accuracy by MARGIN or more. Failing a
correct change: with the spread of the paired differences seen here (standard deviation at most 0.009,
one seed in 30 apart by a few points), it needs a mean difference beyond 1.2 points, about 7.5
standard errors, a chance far below 1e-6 (seeds fixed, the outcome is fixed on a platform; this bounds a
platform whose rounding parts other seeds). The power check: a fused step that forgets to divide by
the records (a sum instead of a mean) fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ldpbench import mechanisms
from ldpbench.fl import clients as fl_clients
from ldpbench.fl.engine import ClientData, FederatedTrainer
from ldpbench.fl.model import FlatModel, build_network
from ldpbench.fl.networks import MultilayerPerceptron
from ldpbench.fl.settings import TrainingSettings

ALPHA = 0.05  # per side: the 90 % interval, the convention of equivalence tests
MARGIN = 0.015  # a point and a half of accuracy
SEEDS = range(30)
ROUNDS = 60
CLIENTS, PER_CLIENT, TEST_RECORDS, DIMS, CLASSES = 8, 40, 400, 20, 4


def noisy_task(seed: int):
    """Gaussian classes whose overlap keeps accuracy near 0.6, so that small changes of the weights
    can move test predictions across the boundary."""
    generator = torch.Generator().manual_seed(1000 + seed)
    centres = torch.randn(CLASSES, DIMS, generator=generator)
    records = CLIENTS * PER_CLIENT + TEST_RECORDS
    labels = torch.randint(0, CLASSES, (records,), generator=generator)
    features = centres[labels] + 3.0 * torch.randn(records, DIMS, generator=generator)
    split = CLIENTS * PER_CLIENT
    return features[:split], labels[:split], features[split:], labels[split:]


def trained(algorithm: str, gradients: str, seed: int):
    """(final test accuracy, final weights) of one run of the task."""
    features, labels, test_features, test_labels = noisy_task(seed)
    partition = fl_clients.partition("iid", labels.numpy(), seed, clients=CLIENTS)
    network = build_network("mlp", (DIMS,), CLASSES, seed, {"hidden": [32, 32]})
    settings = TrainingSettings(learning_rate=0.5 if algorithm == "fedsgd" else 1.0, algorithm=algorithm,
                                cohort_size=4, rounds=ROUNDS, eval_every=ROUNDS, local_batch_size=16,
                                local_learning_rate=0.3, l2=1e-4, gradients=gradients)
    mechanism = mechanisms.create("np", math.inf, FlatModel(network).dims, cohort_size=4)
    result = FederatedTrainer(network, mechanism, ClientData(features, labels, partition), test_features,
                              test_labels, settings, seed).run()
    assert result.final["gradients"] == gradients
    return result.final["test_accuracy"], result.weights


def equivalent(differences: np.ndarray) -> bool:
    """TOST at ALPHA per side: the mean paired difference within ±MARGIN."""
    mean = differences.mean()
    half_width = stats.t.isf(ALPHA, len(differences) - 1) * differences.std(ddof=1) / math.sqrt(len(differences))
    return -MARGIN < mean - half_width and mean + half_width < MARGIN


def paired_differences(algorithm: str) -> tuple[np.ndarray, int]:
    """Fused less per-client final accuracies over SEEDS, and how many seeds ended on the same weights."""
    differences, same_weights = [], 0
    for seed in SEEDS:
        per_client, per_client_weights = trained(algorithm, "per-client", seed)
        fused, fused_weights = trained(algorithm, "fused", seed)
        differences.append(fused - per_client)
        same_weights += torch.equal(per_client_weights, fused_weights)
    return np.array(differences), same_weights


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_fused_gradients_keep_the_accuracy_distribution_over_seeds(algorithm):
    differences, same_weights = paired_differences(algorithm)
    assert same_weights == 0  # the arithmetic did change: no seed ends on the same weights
    assert equivalent(differences), (differences.mean(), differences.std(ddof=1))


@pytest.mark.slow
def test_the_equivalence_check_fails_a_fused_step_that_sums_instead_of_averaging(monkeypatch):
    fused = MultilayerPerceptron.scaled_gradients_into

    def summed(network, inputs, targets, outs, bases, alpha, beta, at=None):
        return fused(network, inputs, targets, outs, bases, alpha * len(inputs), beta, at)

    monkeypatch.setattr(MultilayerPerceptron, "scaled_gradients_into", summed)
    differences, _ = paired_differences("fedavg")
    assert not equivalent(differences)


# The fused arithmetic's numbers, recorded per platform as the golden campaign's are (its MLP trains
# vmapped, so it does not cover this path): a refactor of the fused path must keep them bit for bit.
# SHA-256 of the final weights' bytes of seed 0, trained fused as above; record a platform with
# `python tests/fl/test_fused_equivalence.py` there (from the repository root).
FUSED_DIGESTS = {
    "GenuineIntel-AVX512": {
        "fedsgd": "f141fff6bac55bb01007738b72944923adae9a9be33af5aa36f551fa2b231d25",
        "fedavg": "3b89aa6a3f84a2a92dcbc14503dac62ddb4238f95ba6fc4280c9b22065a1f234",
    },
}


def recorded_digests() -> dict[str, str]:
    """{algorithm: digest of seed 0's final weights, trained fused} on this machine."""
    import hashlib

    return {algorithm: hashlib.sha256(trained(algorithm, "fused", 0)[1].numpy().tobytes()).hexdigest()
            for algorithm in ("fedsgd", "fedavg")}


def test_the_fused_numbers_are_those_recorded_for_this_platform():
    from golden.metrics import platform_signature

    here = platform_signature()
    if here not in FUSED_DIGESTS:
        pytest.skip(f"no recording of the fused numbers for {here} (recorded: {', '.join(FUSED_DIGESTS)})")
    assert recorded_digests() == FUSED_DIGESTS[here]


if __name__ == "__main__":
    print(recorded_digests())
