"""A fully connected network for flat (or flattened) inputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from torch import nn


class MLP(nn.Sequential):
    """``Flatten -> [Linear -> ReLU] * len(hidden) -> Linear``, giving logits.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample; it is flattened, so images work too.
    num_classes : int
        Number of output logits.
    hidden : sequence of int
        Widths of the hidden layers; ``(64,)`` gives the 64 -> 64 -> 10 digits model.
    """

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (64,)
    ) -> None:
        widths = [math.prod(input_shape), *hidden]
        if any(w < 1 for w in widths) or num_classes < 1:
            raise ValueError(
                f"MLP widths must be >= 1: input {widths[0]}, hidden {list(hidden)}, "
                f"classes {num_classes}"
            )
        layers: list[nn.Module] = [nn.Flatten()]
        for fan_in, fan_out in itertools.pairwise(widths):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        super().__init__(*layers)


WIDE_HIDDEN = (512, 512)
"""Hidden widths of ``mlp-wide``."""


def wide_mlp(input_shape: Sequence[int], num_classes: int) -> MLP:
    """``mlp-wide``: two hidden layers of 512 (301k parameters on digits, 670k on 28x28).

    A model whose dense float32 update weighs over 1 MB even on the 8x8 digits, so a
    task's transfers on a slow link take seconds while its training stays short.
    """
    return MLP(input_shape, num_classes, hidden=WIDE_HIDDEN)
