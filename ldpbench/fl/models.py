"""Linear models of the FedSel experiments, with closed-form per-example gradients.

Labels are in {-1, +1}. Both models are l2-regularised with strength λ and have no intercept, as in
FedSel's formulation (one-hot and synthetic features make an intercept unnecessary; d stays the
paper's dimension).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F

from ldpbench.errors import ConfigError


class LinearModel(ABC):
    name: ClassVar[str]

    def __init__(self, l2: float) -> None:
        if l2 < 0:
            raise ConfigError(f"model '{self.name}': l2 must be >= 0, got {l2!r}")
        self.l2 = l2

    @abstractmethod
    def example_losses(self, weights: torch.Tensor, features: torch.Tensor,
                       signs: torch.Tensor) -> torch.Tensor:
        """Unregularised loss of every example, [n]."""

    @abstractmethod
    def loss_slopes(self, margins: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(margin) for margins y·(w·x), [n]."""

    def per_example_gradients(self, weights, features, signs) -> torch.Tensor:
        """∇_w of each example's regularised loss, [n, d] — one matmul-shaped op for the cohort."""
        margins = signs * (features @ weights)
        slopes = self.loss_slopes(margins) * signs
        return slopes.unsqueeze(1) * features + self.l2 * weights

    def loss(self, weights, features, signs) -> torch.Tensor:
        return self.example_losses(weights, features, signs).mean() + 0.5 * self.l2 * weights.dot(weights)

    @staticmethod
    def accuracy(weights, features, signs) -> torch.Tensor:
        predictions = torch.where(features @ weights >= 0, 1.0, -1.0)
        return (predictions == signs).to(torch.float64).mean()


class LogisticRegression(LinearModel):
    name = "lr"

    def example_losses(self, weights, features, signs):
        return F.softplus(-signs * (features @ weights))

    def loss_slopes(self, margins):
        return -torch.sigmoid(-margins)


class LinearSVM(LinearModel):
    """Hinge loss max(0, 1 − y·w·x); its subgradient at the kink is taken as 0."""

    name = "svm"

    def example_losses(self, weights, features, signs):
        return torch.clamp(1.0 - signs * (features @ weights), min=0.0)

    def loss_slopes(self, margins):
        return -(margins < 1.0).to(margins.dtype)


MODELS: dict[str, type[LinearModel]] = {m.name: m for m in (LogisticRegression, LinearSVM)}


def create_model(name: str, l2: float) -> LinearModel:
    try:
        return MODELS[name](l2)
    except KeyError:
        raise ConfigError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))}") from None
