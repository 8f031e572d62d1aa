"""Models the benchmarks bring as a user would: by import path (``model = "pkg.mod:fn"``).

:func:`mlp_11m` is the size of ResNet-18 (11.4M parameters on 28x28 images), in a shape
a 2-core CPU trains in a fraction of a second per batch: what ``sim_scale`` needs to
show the memory of per-node state, which depends on the parameter count, not on the
layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedsync.models.mlp import MLP

HIDDEN_11M = (3000, 3000)
"""Hidden widths of :func:`mlp_11m`."""


def mlp_11m(input_shape: Sequence[int], num_classes: int) -> MLP:
    """Two hidden layers of 3,000: 11,388,010 parameters for 1x28x28 inputs, 10 classes."""
    return MLP(input_shape, num_classes, hidden=HIDDEN_11M)
