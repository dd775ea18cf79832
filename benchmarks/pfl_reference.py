"""pfl-research (Apple's `pfl`, 0.6) doing a scenario's work: the reference of performance goal 7 that
benchmarks/engine_throughput.py runs where pfl is installed (`pip install pfl==0.6.0`, or its files on
PYTHONPATH). Nothing of ldpbench needs it.

The same network (the scenario's own module, with the `loss` and `metrics` methods pfl asks for), the
same clients and records, the same cohort size, and pfl's own simulation: its SimulatedBackend runs
each sampled user's local training through its PyTorch bridge and sums their model differences, and
FederatedAveraging applies the average with a central SGD optimiser. FedSGD is pfl's FedAvg with one
local step over all of a client's records (local_batch_size None, one epoch); FedAvg is one local
epoch of the scenario's batch size. Without a mechanism (the deep scenarios' is "np"), no postprocessor.
Central evaluation is off (no callbacks, evaluation frequency beyond the rounds), as for the engine's
rounds alone.
"""

from __future__ import annotations

import copy
import importlib.util
import time

import numpy as np
import torch

from ldpbench.fl.networks import Network

VERSION_TESTED = "0.6.0"


def available() -> str | None:
    """pfl's version where it is importable, None where not."""
    if importlib.util.find_spec("pfl") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pfl")
    except PackageNotFoundError:  # its files on the path without their metadata
        return "unknown"


class PflNetwork(torch.nn.Module):
    """The scenario's network with the two methods pfl's PyTorchModel calls: `loss` (the batch's mean
    loss, what pfl's local SGD descends) and `metrics` (the summed loss, weighted by examples)."""

    def __init__(self, network: Network) -> None:
        super().__init__()
        self.network = copy.deepcopy(network)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.network(inputs)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
        self.eval() if eval else self.train()
        return self.network.per_example_loss(self(inputs), targets.long()).mean()

    @torch.no_grad()
    def metrics(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
        from pfl.metrics import Weighted

        summed = float(self.network.per_example_loss(self(inputs), targets.long()).sum())
        return {"loss": Weighted(summed, len(targets))}


def seconds_per_round(network: Network, features: torch.Tensor, labels: torch.Tensor,
                      client_records: list[torch.Tensor], algorithm: str, learning_rate: float,
                      cohort_size: int, rounds: int, local_learning_rate: float = 1.0,
                      local_batch_size: int | None = None) -> float:
    """pfl's wall seconds per round, from the end of its first round to the end of round `rounds` + 1.

    pfl evaluates every user before and after its local training in the first round (iteration 0 is a
    multiple of any evaluation frequency): that round, its imports and allocations are left out.
    `client_records[c]` are client c's record indices into `features`/`labels` (uint8 pixels are
    scaled to [0, 1] once, as the engine's inputs are). FedSGD: one local step of rate 1 over all of a
    client's records, so that its model difference is minus its gradient; FedAvg: one epoch of
    `local_batch_size` records at `local_learning_rate`."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    class RoundEnds(TrainingProcessCallback):
        """When each central iteration ended (perf_counter)."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.ends.append(time.perf_counter())
            return False, Metrics()

    inputs = features.float() / 255 if features.dtype == torch.uint8 else features.float()
    data = {client: [inputs[records].numpy(), labels[records].numpy().astype(np.int64)]
            for client, records in enumerate(client_records)}
    federated = FederatedDataset.from_slices(data, get_user_sampler("minimize_reuse", list(data)))
    fedsgd = algorithm == "fedsgd"
    train_params = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=1.0 if fedsgd else local_learning_rate,
                                      local_batch_size=None if fedsgd else local_batch_size)
    module = PflNetwork(network)
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), learning_rate))
    parameters = NNAlgorithmParams(central_num_iterations=rounds + 1, evaluation_frequency=rounds + 2,
                                   train_cohort_size=cohort_size, val_cohort_size=0)
    timer = RoundEnds()
    FederatedAveraging().run(parameters, SimulatedBackend(training_data=federated, val_data=None), model,
                             train_params, NNEvalHyperParams(local_batch_size=None), callbacks=[timer],
                             send_metrics_to_platform=False)
    return (timer.ends[-1] - timer.ends[0]) / rounds
