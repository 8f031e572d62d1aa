"""Exact top-k by magnitude, ties broken towards lower positions.

On CPU the numba backend finds the k-th largest magnitude from a sample-guided
candidate pass (see :func:`fedsync.kernels.select.exact_topk`) instead of a full selection;
elsewhere ``torch.topk`` gives it. Both apply the same tie rule, so the kept set is a
function of the data alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsync.compression.base import Kept, Sparsifier, target_count
from fedsync.compression.config import BuildContext, SparsifierConfig, check_density
from fedsync.compression.registry import register
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import TensorSpec

__all__ = ["TopK", "TopKConfig", "exact_topk_kept"]


@register()
@dataclass(frozen=True)
class TopKConfig(SparsifierConfig):
    """``topk:<density>``: the ``round(density * numel)`` largest magnitudes (>= 1)."""

    name: ClassVar[str] = "topk"
    primary: ClassVar[str | None] = "density"
    density: float = 0.01

    def __post_init__(self) -> None:
        check_density("topk", self.density)

    def build(self, context: BuildContext) -> TopK:
        return TopK(self)


def exact_topk_kept(x: torch.Tensor, k: int) -> Kept:
    """The exact top-k of ``x`` as a :class:`Kept` (shared by the fallbacks)."""
    indices = backend_for(x).exact_topk(x, k)
    return Kept("explicit", indices, x[indices])


class TopK(Sparsifier):
    """Exact top-k by magnitude."""

    config: TopKConfig

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        return exact_topk_kept(x, target_count(x.numel(), self.config.density))

    def max_count(self, spec: TensorSpec) -> int:
        return target_count(spec.numel, self.config.density)
