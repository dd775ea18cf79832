"""What a curve point measures: training and test loss (with the l2 penalty), test accuracy and ROC AUC."""

from __future__ import annotations

import math

import numpy as np
import torch

from ldpbench.fl.model import FlatModel, as_inputs
from ldpbench.fl.networks import Network


def mean_loss(network: Network, outputs: torch.Tensor, labels: torch.Tensor) -> float:
    """The unregularised loss averaged over the examples."""
    return float(network.per_example_loss(outputs, labels).mean())


def accuracy(network: Network, outputs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((network.predict(outputs) == labels).to(torch.float64).mean())


def positive_rank_sum(scores: np.ndarray, positive: np.ndarray) -> float:
    """The sum of the positives' ranks among `scores` (1..n, a tie group given its mean rank, as
    scipy.stats.rankdata's 'average' method), written here because importing scipy.stats costs every
    run job about a second. Each rank is a multiple of ½ and their sum is below 2⁵³, so it is computed
    exactly, as twice the sum in integers: any order of the sum gives the same float. A tie group's
    ranks do not depend on the order within it, so the sort need not be stable (numpy's quicksort
    takes a third of mergesort's time on a 12,000-record test set), and scores are sorted in their
    own dtype (float32 sorts faster than its exact float64 copy, in the same order)."""
    order = np.argsort(scores, kind="quicksort")
    ordered = scores[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]  # the first of each tie group in sorted order
    bounds = np.r_[np.flatnonzero(starts), len(ordered)]  # group g holds sorted positions bounds[g]..bounds[g+1]-1
    group = np.cumsum(starts)[positive[order]] - 1
    return 0.5 * float((bounds[group] + bounds[group + 1] + 1).sum())


def area_under_curve(scores: torch.Tensor, labels: torch.Tensor, task: str) -> float:
    """ROC AUC (ties count one half): binary, or the macro one-vs-rest mean over the classes present."""
    scores = scores.detach().cpu()
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.double()
    scores, labels = scores.numpy(), labels.cpu().numpy()
    if not np.isfinite(scores).all():
        return float("nan")

    def binary(score, positive) -> float:
        positives = int(positive.sum())
        negatives = len(positive) - positives
        if positives == 0 or negatives == 0:
            return float("nan")
        return float((positive_rank_sum(score, positive) - positives * (positives + 1) / 2) / (positives * negatives))

    if task == "binary":
        return binary(scores, labels == 1)
    present = [c for c in np.unique(labels) if 0 < (labels == c).sum() < len(labels)]
    values = [binary(scores[:, c], labels == c) for c in present]
    return float(np.mean(values)) if values else float("nan")


# A set's inputs converted to the working dtype once, not at every evaluation, where the converted
# copy takes at most this much memory (else they are converted a batch at a time, as before).
CONVERTED_ONCE_BYTES = 64 * 2**20


class Evaluator:
    """The metrics of one set of server weights: losses on a fixed training sample, the test set and
    the validation clients' records (with the l2 penalty ½·l2·|w|², the objective training minimises),
    accuracy and AUC. A set without records (no validation clients; no test split for a run on the
    public part) gives NaN metrics."""

    def __init__(self, model: FlatModel, train_features: torch.Tensor, train_labels: torch.Tensor,
                 test_features: torch.Tensor, test_labels: torch.Tensor, l2: float, dtype: torch.dtype,
                 validation_features: torch.Tensor | None = None,
                 validation_labels: torch.Tensor | None = None) -> None:
        self.model, self.l2, self.dtype = model, l2, dtype
        self.train_features, self.train_labels = self._converted(train_features), train_labels
        self.sets = {"test": (self._converted(test_features), test_labels)}
        if validation_labels is not None:
            self.sets["validation"] = (self._converted(validation_features), validation_labels)

    def _converted(self, features: torch.Tensor | None) -> torch.Tensor | None:
        """`features` as the model's inputs (as_inputs: the same values, elementwise), where that copy is
        small (CONVERTED_ONCE_BYTES); else as they are, converted a batch at a time by `outputs`. Converted
        at every evaluation, uint8 images (or records of another dtype) cost each evaluation a pass."""
        if features is None or not features.is_floating_point() and features.dtype != torch.uint8:
            return features  # token ids: as_inputs keeps them
        small = features.numel() * self.dtype.itemsize <= CONVERTED_ONCE_BYTES
        return as_inputs(features, self.dtype) if small else features

    @property
    def finite_metrics(self) -> list[str]:
        """The metrics that stay finite while training does: the losses and accuracies of the sets
        that have records (AUC is NaN legitimately when a set holds one class)."""
        held_out = [name for name, (_, labels) in self.sets.items() if labels is not None and len(labels)]
        return ["train_loss", *(f"{name}_{metric}" for name in held_out for metric in ("loss", "accuracy"))]

    @torch.no_grad()
    def outputs(self, weights: torch.Tensor, features: torch.Tensor, batch: int = 4096) -> torch.Tensor:
        outputs = [self.model.outputs(weights, as_inputs(features[i:i + batch], self.dtype))
                   for i in range(0, len(features), batch)]
        return torch.cat(outputs) if outputs else torch.empty(0)

    def _held_out(self, name: str, weights: torch.Tensor, penalty: float) -> dict[str, float]:
        features, labels = self.sets.get(name, (None, None))
        if labels is None or len(labels) == 0:
            return {f"{name}_loss": math.nan, f"{name}_accuracy": math.nan, f"{name}_auc": math.nan}
        network = self.model.network
        outputs = self.outputs(weights, features)
        return {
            f"{name}_loss": mean_loss(network, outputs, labels) + penalty,
            f"{name}_accuracy": accuracy(network, outputs, labels),
            f"{name}_auc": area_under_curve(network.scores(outputs), labels, network.task),
        }

    @torch.no_grad()
    def __call__(self, weights: torch.Tensor) -> dict[str, float]:
        penalty = 0.5 * self.l2 * float(weights.dot(weights))
        train_outputs = self.outputs(weights, self.train_features)
        return {
            "train_loss": mean_loss(self.model.network, train_outputs, self.train_labels) + penalty,
            **self._held_out("test", weights, penalty),
            **self._held_out("validation", weights, penalty),
        }
