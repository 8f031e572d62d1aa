"""``none``: every value travels, in order, with no positions (``index_mode="dense"``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsync.compression.base import Kept, Sparsifier
from fedsync.compression.config import BuildContext, SparsifierConfig
from fedsync.compression.registry import register
from fedsync.updates import IndexMode, TensorSpec

__all__ = ["Dense", "DenseConfig"]


@register()
@dataclass(frozen=True)
class DenseConfig(SparsifierConfig):
    """``none``: no sparsification."""

    name: ClassVar[str] = "none"

    def build(self, context: BuildContext) -> Dense:
        return Dense(self)


class Dense(Sparsifier):
    """Keeps everything; the positions are implicit."""

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        return Kept("dense", None, x)

    def max_count(self, spec: TensorSpec) -> int:
        return spec.numel

    def index_mode(self, spec: TensorSpec) -> IndexMode:
        return "dense"
