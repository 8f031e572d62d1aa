"""Random-k: ``round(density * numel)`` positions drawn uniformly without replacement.

The positions come from this tensor's own numpy generator (seeded from the call seed
and the tensor name), so they are reproducible and identical on every device. Values
are not rescaled by ``numel / k``: under error feedback (the usual pairing) the
unsent mass stays in the residual instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Kept, Sparsifier, target_count
from fedsync.compression.config import BuildContext, SparsifierConfig, check_density
from fedsync.compression.registry import register
from fedsync.compression.seeding import rng_for
from fedsync.updates import TensorSpec

__all__ = ["RandomK", "RandomKConfig"]


@register()
@dataclass(frozen=True)
class RandomKConfig(SparsifierConfig):
    """``randomk:<density>``: uniformly random positions, seeded."""

    name: ClassVar[str] = "randomk"
    primary: ClassVar[str | None] = "density"
    density: float = 0.01

    def __post_init__(self) -> None:
        check_density("randomk", self.density)

    def build(self, context: BuildContext) -> RandomK:
        return RandomK(self)


class RandomK(Sparsifier):
    """Seeded uniform random positions."""

    config: RandomKConfig

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        n = x.numel()
        k = target_count(n, self.config.density)
        picked = rng_for(seed, "randomk").choice(n, size=k, replace=False, shuffle=False)
        positions = torch.from_numpy(np.sort(picked).astype(np.int64)).to(x.device)
        return Kept("explicit", positions, x[positions])

    def max_count(self, spec: TensorSpec) -> int:
        return target_count(spec.numel, self.config.density)
