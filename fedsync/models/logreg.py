"""Multinomial logistic regression, FedProx's model for its synthetic data."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """``Flatten -> Linear``: one weight row per class.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample (flattened).
    num_classes : int
        Number of output logits.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        if math.prod(input_shape) < 1 or num_classes < 1:
            raise ValueError(
                f"logreg needs a non-empty input and >= 1 class, got {tuple(input_shape)}, "
                f"{num_classes}"
            )
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape ``(batch, num_classes)``."""
        return self.linear(x.flatten(1))
