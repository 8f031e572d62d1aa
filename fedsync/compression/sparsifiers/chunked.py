"""``chunktopk``: the ``k`` largest magnitudes of every block (SparseLoCo's selection).

A tensor of two or more dimensions is viewed as a matrix ``(m, n)`` (the first
dimension by the product of the rest, :func:`fedsync.updates.matrix_dims`) and cut into
blocks of ``bh x bw``, where ``bh`` is the largest divisor of ``m`` that is at most
``block`` and ``bw`` the same for ``n``: with ``block = 64`` a ``128 x 512`` weight is
cut into 16 blocks of ``64 x 64 = 4096`` values. A 0-d or 1-d tensor is cut into
chunks of the largest divisor of its length that is at most ``block``. Each block
keeps its ``min(k, block size)`` largest magnitudes, ties to the lower flat position
(a stable sort, so the kept set is a function of the data alone): ``chunktopk:128``
keeps 128 of 4096 values (3.1 %) in a full block, and every value of a small one
(SparseLoCo's reference clamps ``k`` to the block the same way, so biases and norms
travel whole).

Selecting per block rather than over the whole tensor spreads the kept values over
the tensor, and the positions are evenly spread for the index coders.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsync.compression.base import Kept, Sparsifier, top_per_row
from fedsync.compression.config import MAX_STAGE_INT, BuildContext, SparsifierConfig
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import register
from fedsync.updates import TensorSpec, matrix_dims

__all__ = ["ChunkTopK", "ChunkTopKConfig", "block_shape"]

MAX_BLOCK = 4096
"""Largest ``block`` side a spec may name."""


@register()
@dataclass(frozen=True)
class ChunkTopKConfig(SparsifierConfig):
    """``chunktopk:<k>[,block=<b>]``: the ``k`` largest magnitudes of every block.

    Parameters
    ----------
    k : int
        Values kept per block (a smaller block keeps all of its values), >= 1.
    block : int
        The largest side of a block, in ``[1, 4096]`` (see the module docstring).
    """

    name: ClassVar[str] = "chunktopk"
    primary: ClassVar[str | None] = "k"
    k: int = 128
    block: int = 64

    def __post_init__(self) -> None:
        for key in ("k", "block"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"chunktopk: {key} must be an int, got {value!r}")
        if not 1 <= self.block <= MAX_BLOCK:
            raise SpecError(f"chunktopk: block must be in [1, {MAX_BLOCK}], got {self.block}")
        if not 1 <= self.k <= MAX_STAGE_INT:
            raise SpecError(f"chunktopk: k must be >= 1 (values kept per block), got {self.k}")

    @property
    def density(self) -> float:
        """Kept fraction of a tensor cut into full ``block x block`` blocks."""
        return min(1.0, self.k / (self.block * self.block))

    def build(self, context: BuildContext) -> ChunkTopK:
        return ChunkTopK(self)


@functools.lru_cache(maxsize=4096)
def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n >= 1`` that is at most ``at_most``."""
    best = 1
    d = 1
    while d * d <= n:
        if n % d == 0:
            if d <= at_most:
                best = max(best, d)
            if n // d <= at_most:
                best = max(best, n // d)
        d += 1
    return best


def block_shape(shape: tuple[int, ...], block: int) -> tuple[int, int, int, int]:
    """``(rows, cols, bh, bw)``: the tensor as a ``rows x cols`` matrix (a 1-d or 0-d
    one as a single row) and the block it is cut into."""
    dims = matrix_dims(shape)
    rows, cols = dims if dims is not None else (1, max(1, int(torch.Size(shape).numel())))
    if rows == 1:
        return rows, cols, 1, _largest_divisor(cols, block)
    return rows, cols, _largest_divisor(rows, block), _largest_divisor(cols, block)


class ChunkTopK(Sparsifier):
    """Top-``k`` magnitudes per block (see the module docstring)."""

    config: ChunkTopKConfig

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        # Without a shape a tensor is one row of chunks.
        return self._select(x, (x.numel(),))

    def select_for(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Kept:
        return self._select(x, spec.shape)

    def _select(self, x: torch.Tensor, shape: tuple[int, ...]) -> Kept:
        if x.numel() == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=x.device)
            return Kept("explicit", empty, x[:0])
        rows, cols, bh, bw = block_shape(shape, self.config.block)
        size = bh * bw
        k = min(self.config.k, size)
        # (rows/bh, bh, cols/bw, bw) -> (blocks, bh * bw): each row is one block.
        blocks = x.view(rows // bh, bh, cols // bw, bw).permute(0, 2, 1, 3).reshape(-1, size)
        order = top_per_row(blocks, k)
        # Block-local (i, j) back to the flat position (row * cols + col).
        block_id = torch.arange(blocks.shape[0], device=x.device, dtype=torch.int64)[:, None]
        block_row, block_col = block_id // (cols // bw), block_id % (cols // bw)
        row = block_row * bh + order // bw
        col = block_col * bw + order % bw
        positions = torch.sort((row * cols + col).reshape(-1)).values
        return Kept("explicit", positions, x[positions])

    def max_count(self, spec: TensorSpec) -> int:
        if spec.numel == 0:
            return 0
        rows, cols, bh, bw = block_shape(spec.shape, self.config.block)
        return (rows // bh) * (cols // bw) * min(self.config.k, bh * bw)
