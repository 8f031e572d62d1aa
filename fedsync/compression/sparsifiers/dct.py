"""``dct``: top-k of a chunked DCT-II, the transform DeMo sends momentum through.

The flattened tensor is cut into chunks of ``chunk`` consecutive values (the last
one shorter when ``chunk`` does not divide the tensor: it gets the DCT of its own
length, so nothing is padded and the coefficient array has exactly ``numel``
entries). Each chunk is transformed by the orthonormal DCT-II as a matrix product
(``coeffs = x @ D.T``; the inverse is ``coeffs @ D``) and its ``k`` largest
magnitudes are kept, ties towards the lower position (a stable sort, so the kept set
is a function of the data alone). Positions are coefficient positions in
``[0, numel)``; the frame's index coders code them (with ``k`` per ``chunk`` they
are evenly spread, about ``log2(chunk / k) + 2`` bits each under Rice or
Elias-Fano).

This is a 1-d chunking of the flattened tensor: DeMo's reference transforms 2-d
weights in ``chunk x chunk`` blocks; the 1-d form treats every tensor alike and
needs one ``chunk x chunk`` matrix instead of two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Kept
from fedsync.compression.config import BuildContext, SparsifierConfig
from fedsync.compression.errors import CodecMismatch, SpecError
from fedsync.compression.registry import register
from fedsync.compression.transform import TransformSparsifier
from fedsync.updates import TensorSpec

__all__ = ["DCTConfig", "DCTTopK", "chunk_counts", "dct_matrix"]

MAX_CHUNK = 4096
"""Largest chunk (its DCT matrix has ``chunk**2`` float32 entries: 64 MiB)."""


@register()
@dataclass(frozen=True)
class DCTConfig(SparsifierConfig):
    """``dct:<k>[,chunk=<n>]``: keep the ``k`` largest DCT coefficients per chunk.

    Parameters
    ----------
    k : int
        Coefficients kept per chunk, in ``[1, chunk]`` (a short last chunk keeps
        ``min(k, its length)``).
    chunk : int
        Values per chunk, in ``[2, 4096]``.
    """

    name: ClassVar[str] = "dct"
    primary: ClassVar[str | None] = "k"
    k: int = 8
    chunk: int = 64

    def __post_init__(self) -> None:
        for key in ("k", "chunk"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"dct: {key} must be an int, got {value!r}")
        if not 2 <= self.chunk <= MAX_CHUNK:
            raise SpecError(f"dct: chunk must be in [2, {MAX_CHUNK}], got {self.chunk}")
        if not 1 <= self.k <= self.chunk:
            raise SpecError(
                f"dct: k must be in [1, chunk={self.chunk}] (coefficients kept per chunk), "
                f"got {self.k}"
            )

    @property
    def density(self) -> float:
        """Kept fraction of a tensor whose size ``chunk`` divides."""
        return self.k / self.chunk

    def build(self, context: BuildContext) -> DCTTopK:
        return DCTTopK(self)


@lru_cache(maxsize=16)
def _dct_host(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix of size ``n`` (rows: frequencies), float32 on CPU.

    Computed in float64 and rounded once, so it is the same on every machine.
    """
    freq = np.arange(n, dtype=np.float64)[:, None]
    pos = np.arange(n, dtype=np.float64)[None, :]
    matrix = np.cos(np.pi * (2.0 * pos + 1.0) * freq / (2.0 * n)) * math.sqrt(2.0 / n)
    matrix[0, :] /= math.sqrt(2.0)
    return torch.from_numpy(matrix.astype(np.float32))


MAX_DENSE_NUMEL = 1 << 28
"""Largest tensor a receiver rebuilds (the inverse transform is dense): 1 GiB of float32."""

_DEVICE_CACHE: dict[tuple[int, torch.device], torch.Tensor] = {}


def dct_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal DCT-II matrix ``D`` of size ``n`` on ``device`` (``D @ D.T == I``)."""
    device = torch.device(device)
    key = (n, device)
    matrix = _DEVICE_CACHE.get(key)
    if matrix is None:
        matrix = _dct_host(n).to(device)
        if len(_DEVICE_CACHE) >= 16:  # tails of odd lengths must not grow it without bound
            _DEVICE_CACHE.pop(next(iter(_DEVICE_CACHE)))
        _DEVICE_CACHE[key] = matrix
    return matrix


def chunk_counts(numel: int, chunk: int, k: int) -> tuple[int, int, int]:
    """``(full chunks, tail length, coefficients kept in all)`` of a tensor."""
    full, tail = divmod(numel, chunk)
    return full, tail, full * k + min(k, tail)


def _transform(x: torch.Tensor, chunk: int, *, inverse: bool) -> torch.Tensor:
    """Chunked DCT-II of the 1-d ``x`` (or its inverse), float32, same length."""
    full, tail = divmod(x.numel(), chunk)
    out = torch.empty_like(x)
    for start, count, size in ((0, full, chunk), (full * chunk, 1 if tail else 0, tail)):
        if count == 0:
            continue
        matrix = dct_matrix(size, x.device)
        block = x[start : start + count * size].view(count, size)
        result = block @ matrix if inverse else block @ matrix.T
        out[start : start + count * size] = result.reshape(-1)
    return out


def _top_per_row(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of the ``k`` largest magnitudes per row, ties to the lower one."""
    order = torch.sort(rows.abs(), dim=1, descending=True, stable=True).indices
    return order[:, :k]


class DCTTopK(TransformSparsifier):
    """Top-k per chunk of the chunked DCT-II (see the module docstring)."""

    config: DCTConfig

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        chunk, k = self.config.chunk, self.config.k
        coeffs = _transform(x, chunk, inverse=False)
        full, tail = divmod(x.numel(), chunk)
        parts: list[torch.Tensor] = []
        if full:
            cols = _top_per_row(coeffs[: full * chunk].view(full, chunk), k)
            base = torch.arange(full, device=x.device, dtype=torch.int64)[:, None] * chunk
            parts.append((cols + base).reshape(-1))
        if tail:
            cols = _top_per_row(coeffs[full * chunk :].view(1, tail), min(k, tail))
            parts.append(cols.reshape(-1) + full * chunk)
        if parts:
            positions = torch.sort(torch.cat(parts)).values
        else:
            positions = torch.zeros(0, dtype=torch.int64, device=x.device)
        return Kept("explicit", positions, coeffs[positions])

    def max_count(self, spec: TensorSpec) -> int:
        return chunk_counts(spec.numel, self.config.chunk, self.config.k)[2]

    def inverse(
        self, spec: TensorSpec, positions: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        chunk, k = self.config.chunk, self.config.k
        label = repr(spec.name)
        if spec.numel > MAX_DENSE_NUMEL:
            raise CodecMismatch(
                "tensor too large to rebuild densely from DCT coefficients",
                field="shape",
                tensor=label,
                expected=f"<= {MAX_DENSE_NUMEL} elements",
                got=spec.numel,
            )
        want = self.max_count(spec)
        if positions.numel() != want:
            # The sender keeps exactly min(k, length) per chunk, so a frame cannot make
            # the receiver build a large dense tensor from a handful of values.
            raise CodecMismatch(
                "dct sends exactly k coefficients per chunk",
                field="value count",
                tensor=label,
                expected=want,
                got=positions.numel(),
            )
        if positions.numel():
            per_chunk = torch.bincount(positions // chunk)
            worst = int(per_chunk.max())
            if worst > k:
                raise CodecMismatch(
                    "more coefficients in one chunk than dct keeps",
                    field="indices",
                    tensor=label,
                    expected=f"<= {k} per chunk of {chunk}",
                    got=f"{worst} in chunk {int(torch.argmax(per_chunk))}",
                )
        coeffs = torch.zeros(spec.numel, dtype=torch.float32, device=values.device)
        coeffs[positions.to(values.device)] = values.to(torch.float32)
        return _transform(coeffs, chunk, inverse=True)
