"""A LeNet-5-style convolutional network for small grey-level images."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class LeNet5(nn.Module):
    """Two conv + max-pool stages and three fully connected layers (~61k parameters at 28x28).

    ``conv5x5(6, pad 2) -> pool -> conv5x5(16) -> pool -> 120 -> 84 -> classes``, ReLU
    throughout. Small on purpose: it trains in seconds per client on a CPU and keeps
    update sizes realistic for edge devices, yet reaches ~99 % on MNIST and ~90 % on
    Fashion-MNIST.

    Parameters
    ----------
    input_shape : tuple of int
        ``(channels, height, width)``; height and width at least 12.
    num_classes : int
        Number of output logits.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"cnn needs (channels, height, width) input, got {tuple(input_shape)}")
        channels, height, width = (int(d) for d in input_shape)
        # Spatial size after conv(pad 2) -> pool -> conv(no pad) -> pool.
        out_h, out_w = (height // 2 - 4) // 2, (width // 2 - 4) // 2
        if out_h < 1 or out_w < 1 or num_classes < 1:
            raise ValueError(
                f"cnn needs images of at least 12x12 and >= 1 class, got {tuple(input_shape)}, "
                f"{num_classes}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * out_h * out_w, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape ``(batch, num_classes)``."""
        return self.classifier(self.features(x))
