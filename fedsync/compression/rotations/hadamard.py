"""``rht``: a seeded randomized Hadamard rotation of the kept values (EDEN, DoCoFL).

A few heavy-tailed coordinates set the range of a low-bit quantizer's chunk and leave
every other value of it on one or two levels. Rotating first spreads them: the rotated
block ``H D x / sqrt(b)`` (``D`` a random +-1 diagonal, ``H`` the Walsh-Hadamard matrix
of a power-of-two size ``b``) has coordinates of about ``||x|| / sqrt(b)`` each, so a
uniform quantizer with a scale per block (``uniform:<bits>`` with ``chunk`` = ``block``:
the defaults, 1024, agree) spends its levels on the block's energy, not on its largest
value. The receiver dequantizes and applies the inverse, ``D H / sqrt(b)``.

Per tensor of ``n`` kept values (the sparsifier's values, so it composes with every
sparsifier; dense deltas are ``none+rht+uniform:4``):

* the block is ``b = min(block, 2**floor(log2 n))``;
* values ``[0, b * floor(n / b))`` are flipped by ``D`` and transformed in consecutive
  blocks of ``b``;
* when ``b`` does not divide ``n``, the last ``b`` values ``[n - b, n)`` (the tail and
  the end of the last full block, already rotated) are flipped by a second diagonal and
  transformed once more. Nothing is padded: the frame carries exactly ``n`` codes, as
  without the rotation, and every value is mixed within at least ``b`` values (for a
  tensor shorter than ``block``, more than half of it).

The inverse undoes the two steps in reverse order. Both are orthonormal, so the
quantization error keeps its norm through the inverse.

The signs are not sent. They are bits of a hash of the position and a key derived
from the frame seed (which the frame carries once, see :mod:`fedsync.wire.layout`)
and the tensor's name: Wellons' ``lowbias32`` applied twice to ``(key, i // 32)``,
one hash per 32 signs, computed with int64 torch ops whose products stay below
``2**63`` (no overflow), so CPU and GPU draw the same signs.
The transform is a radix-2 butterfly of additions and subtractions, then one float32
scale: the same operations in the same order on every device, so the rotated values
(and a frame's bytes) do not depend on where they were computed. Cost: ``log2 b``
passes of adds over the values plus a few integer ops per value for the signs, in
slabs of :data:`SLAB` values, so the working memory beyond the output is a few slabs
whatever the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
import torch

from fedsync.compression.base import Rotation
from fedsync.compression.config import BuildContext, RotationConfig
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import register
from fedsync.compression.seeding import derive_seed

__all__ = [
    "MAX_BLOCK",
    "SLAB",
    "RHTConfig",
    "RandomizedHadamard",
    "block_for",
    "fwht",
    "lowbias32",
    "rademacher_signs",
]

MAX_BLOCK: Final = 1 << 16
"""Largest block a spec may name (a larger one spreads no better for low-bit codes and
only costs more passes)."""

SLAB: Final = 1 << 18
"""Values transformed at once: bounds the working memory (the signs' int64 hashes and
two float32 buffers) to a few MiB whatever the tensor."""

_M32: Final = 0xFFFFFFFF


@register()
@dataclass(frozen=True)
class RHTConfig(RotationConfig):
    """``rht[:<block>]``: randomized Hadamard rotation in blocks of ``block`` values.

    Parameters
    ----------
    block : int
        A power of two in ``[2, 65536]``; give the quantizer the same chunk (the
        defaults, 1024, agree) so every block gets its own scale.
    """

    name: ClassVar[str] = "rht"
    primary: ClassVar[str | None] = "block"
    block: int = 1024

    def __post_init__(self) -> None:
        block = self.block
        if (
            not isinstance(block, int)
            or isinstance(block, bool)
            or not 2 <= block <= MAX_BLOCK
            or block & (block - 1)
        ):
            raise SpecError(f"rht: block must be a power of two in [2, {MAX_BLOCK}], got {block!r}")

    def build(self, context: BuildContext) -> RandomizedHadamard:
        return RandomizedHadamard(self)


def block_for(n: int, block: int) -> int:
    """The block a tensor of ``n`` values is rotated in: ``block``, or the largest
    power of two not above ``n`` when that is smaller (``0`` for an empty tensor)."""
    if n <= 0:
        return 0
    return min(block, 1 << (n.bit_length() - 1))


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``(x * constant) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, in two 16-bit
    halves of the constant so no product reaches ``2**63``."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _M32


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' ``lowbias32`` hash of int64 ``x`` in ``[0, 2**32)`` (the same numbers
    as the C reference on uint32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0xD35A2D97)
    return x ^ (x >> 15)


def rademacher_signs(
    key: int, start: int, count: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``count`` float32 signs (+-1) of positions ``start, start + 1, ...`` for ``key``.

    The sign of position ``i`` is bit ``i % 32`` of a hash of ``(key, i // 32)``: a
    counter-based stream (any slice is drawn without the ones before it, every device
    draws the same signs) at one hash per 32 signs.
    """
    key = int(key) & ((1 << 64) - 1)
    if count <= 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    first, last = start >> 5, (start + count - 1) >> 5
    word = torch.arange(first, last + 1, dtype=torch.int64, device=device)
    h = lowbias32((word & _M32) ^ (key & _M32))
    h = lowbias32(h ^ (((word >> 32) ^ (key >> 32)) & _M32))
    # The same 32 bits as int32 (the value, not a wrapping cast), so the unpacking over
    # every position runs on half the bytes; bit j of a negative int32 shifted right
    # (arithmetically) by j is still bit j.
    h32 = (h - ((h >> 31) << 32)).to(torch.int32)
    lanes = torch.arange(32, dtype=torch.int32, device=device)
    bits = ((h32[:, None] >> lanes) & 1).reshape(-1)
    offset = start - (first << 5)
    return bits[offset : offset + count].to(torch.float32).mul_(-2.0).add_(1.0)


def _fwht_rows(x: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform of every row of ``x`` (rows x b, b a power
    of two, contiguous float32), using ``x`` and ``work`` (same shape) as ping-pong
    buffers: the result is one of them."""
    rows, n = x.shape
    src, dst = x, work
    half = 1
    while half < n:
        s = src.view(rows, n // (2 * half), 2, half)
        d = dst.view(rows, n // (2 * half), 2, half)
        torch.add(s[:, :, 0], s[:, :, 1], out=d[:, :, 0])
        torch.sub(s[:, :, 0], s[:, :, 1], out=d[:, :, 1])
        src, dst = dst, src
        half *= 2
    if n > 1:
        # 1/sqrt(n) rounded to float32 first: a product of two float32 numbers rounds
        # to the same float32 whether a device computes it in float32 or float64.
        src.mul_(float(np.float32(1.0 / math.sqrt(n))))
    return src


def fwht(x: torch.Tensor) -> torch.Tensor:
    """The orthonormal fast Walsh-Hadamard transform along the last dimension.

    ``H_n / sqrt(n)`` in Sylvester's (natural) order; symmetric and orthonormal, so it
    is its own inverse. ``O(n log n)`` adds per row.

    Parameters
    ----------
    x : torch.Tensor
        float32, last dimension a power of two; any leading shape, any device.

    Returns
    -------
    torch.Tensor
        A new tensor of ``x``'s shape (``x`` is not changed).
    """
    n = x.shape[-1]
    if n <= 0 or n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two last dimension, got {n}")
    rows = x.detach().to(torch.float32).reshape(-1, n).clone(memory_format=torch.contiguous_format)
    return _fwht_rows(rows, torch.empty_like(rows)).reshape(x.shape)


class RandomizedHadamard(Rotation):
    """Blocks of ``D`` then ``H / sqrt(b)``, plus the overlapping last block (see the
    module docstring)."""

    config: RHTConfig

    def _plan(self, name: str, n: int, seed: int) -> tuple[int, int, int, int]:
        """``(b, full blocks, key of D, key of the last block's diagonal)``."""
        b = block_for(n, self.config.block)
        full = n // b if b else 0
        return b, full, derive_seed(seed, name, "rht"), derive_seed(seed, name, "rht", "last")

    def rotate(self, name: str, values: torch.Tensor, seed: int) -> torch.Tensor:
        out = values.detach().to(torch.float32).clone(memory_format=torch.contiguous_format)
        n = out.numel()
        b, full, key, last_key = self._plan(name, n, seed)
        work = torch.empty(min(n, max(b, SLAB)), dtype=torch.float32, device=out.device)
        for start, stop in _slabs(full, b):
            segment = out[start:stop]
            segment.mul_(rademacher_signs(key, start, stop - start, out.device))
            _transform_(segment, work, b)
        if b and n % b:
            segment = out[n - b :]
            segment.mul_(rademacher_signs(last_key, 0, b, out.device))
            _transform_(segment, work, b)
        return out

    def unrotate(self, name: str, values: torch.Tensor, seed: int) -> torch.Tensor:
        out = values.detach().to(torch.float32).clone(memory_format=torch.contiguous_format)
        n = out.numel()
        b, full, key, last_key = self._plan(name, n, seed)
        work = torch.empty(min(n, max(b, SLAB)), dtype=torch.float32, device=out.device)
        if b and n % b:
            segment = out[n - b :]
            _transform_(segment, work, b)
            segment.mul_(rademacher_signs(last_key, 0, b, out.device))
        for start, stop in _slabs(full, b):
            segment = out[start:stop]
            _transform_(segment, work, b)
            segment.mul_(rademacher_signs(key, start, stop - start, out.device))
        return out


def _transform_(segment: torch.Tensor, work: torch.Tensor, b: int) -> None:
    """Replace the contiguous 1-d ``segment`` (whole blocks of ``b``) by the FWHT of
    each block, with ``work`` (at least as long) as the second buffer."""
    rows = segment.view(-1, b)
    result = _fwht_rows(rows, work[: segment.numel()].view(-1, b))
    if result is not rows:  # an odd number of passes ended in the work buffer
        rows.copy_(result)


def _slabs(full: int, b: int) -> list[tuple[int, int]]:
    """Value ranges of whole blocks, at most :data:`SLAB` values each (one block at
    least)."""
    if not full:
        return []
    per = max(1, SLAB // b)
    return [(r * b, min(full, r + per) * b) for r in range(0, full, per)]
