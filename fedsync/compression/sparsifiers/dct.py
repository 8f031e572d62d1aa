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
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np
import torch

from fedsync.compression.base import Kept, top_per_row
from fedsync.compression.config import BuildContext, SparsifierConfig
from fedsync.compression.errors import CodecMismatch, SpecError
from fedsync.compression.registry import register
from fedsync.compression.transform import TransformSparsifier
from fedsync.updates import TensorSpec

__all__ = ["DCTConfig", "DCTMatrixCache", "DCTTopK", "chunk_counts", "dct_matrix"]

MAX_CHUNK = 4096
"""Largest chunk (its DCT matrix has ``chunk**2`` float32 entries: 64 MiB)."""

MATRIX_CACHE_BYTES: Final = 2 * 4 * MAX_CHUNK * MAX_CHUNK
"""Bytes of DCT matrices kept, over every size and device together (128 MiB): the
largest matrix fits with room for the shorter last chunk's, so a ``chunk=4096`` encode
of tensors that leave a tail does not rebuild the large one each time; least recently
used ones make room for a new one."""

_BUILD_ROWS = 256
"""Rows of a matrix computed at once (in float64): bounds the work memory of a build
to a few ``_BUILD_ROWS x n`` arrays besides the float32 result."""


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


def _build_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix of size ``n`` (rows: frequencies), float32 on CPU.

    Computed in float64 and rounded once, so it is the same on every machine; a block
    of rows at a time, so the float64 work arrays stay small whatever ``n``.
    """
    out = torch.empty((n, n), dtype=torch.float32)
    pos = np.arange(n, dtype=np.float64)[None, :]
    for start in range(0, n, _BUILD_ROWS):
        freq = np.arange(start, min(start + _BUILD_ROWS, n), dtype=np.float64)[:, None]
        rows = np.cos(np.pi * (2.0 * pos + 1.0) * freq / (2.0 * n)) * math.sqrt(2.0 / n)
        if start == 0:
            rows[0, :] /= math.sqrt(2.0)
        out[start : start + len(freq)] = torch.from_numpy(rows.astype(np.float32))
    return out


class DCTMatrixCache:
    """DCT matrices by (size, device), bounded in bytes, least recently used evicted.

    The size is checked before anything is built: no larger than :data:`MAX_CHUNK`
    (what a spec may name), and room is made before the new matrix is built. A matrix
    larger than the whole budget is built and returned but not kept. Thread-safe.

    Parameters
    ----------
    max_bytes : int
        The most bytes kept, over every size and device together.
    """

    def __init__(self, max_bytes: int = MATRIX_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._matrices: OrderedDict[tuple[int, torch.device], torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._matrices)

    def get(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The orthonormal DCT-II matrix of size ``n`` on ``device``, float32.

        Raises
        ------
        ValueError
            If ``n`` is not in ``[1, MAX_CHUNK]`` (checked before anything is built).
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHUNK:
            raise ValueError(f"a DCT matrix size must be an int in [1, {MAX_CHUNK}], got {n!r}")
        key = (n, torch.device(device))
        nbytes = 4 * n * n
        with self._lock:
            matrix = self._matrices.get(key)
            if matrix is not None:
                self._matrices.move_to_end(key)
                return matrix
            keep = nbytes <= self.max_bytes
            while keep and self._bytes + nbytes > self.max_bytes:
                _, evicted = self._matrices.popitem(last=False)
                self._bytes -= 4 * evicted.numel()
            matrix = _build_matrix(n).to(key[1])
            if keep:
                self._matrices[key] = matrix
                self._bytes += nbytes
            return matrix

    def clear(self) -> None:
        """Drop every matrix."""
        with self._lock:
            self._matrices.clear()
            self._bytes = 0


MAX_DENSE_NUMEL = 1 << 28
"""Largest tensor a receiver rebuilds (the inverse transform is dense): 1 GiB of float32."""

MATRICES = DCTMatrixCache()
"""The matrices every DCT sparsifier shares (:data:`MATRIX_CACHE_BYTES` at most)."""


def dct_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal DCT-II matrix ``D`` of size ``n`` on ``device`` (``D @ D.T == I``),
    from :data:`MATRICES`.

    Raises
    ------
    ValueError
        If ``n`` is not in ``[1, MAX_CHUNK]``.
    """
    return MATRICES.get(n, device)


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


class DCTTopK(TransformSparsifier):
    """Top-k per chunk of the chunked DCT-II (see the module docstring)."""

    config: DCTConfig

    def select(self, name: str, x: torch.Tensor, seed: int) -> Kept:
        chunk, k = self.config.chunk, self.config.k
        coeffs = _transform(x, chunk, inverse=False)
        full, tail = divmod(x.numel(), chunk)
        parts: list[torch.Tensor] = []
        if full:
            cols = top_per_row(coeffs[: full * chunk].view(full, chunk), k)
            base = torch.arange(full, device=x.device, dtype=torch.int64)[:, None] * chunk
            parts.append((cols + base).reshape(-1))
        if tail:
            cols = top_per_row(coeffs[full * chunk :].view(1, tail), min(k, tail))
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
