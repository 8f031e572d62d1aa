"""Philox4x32-10 on the CPU, bit for bit the generator behind ``tl.randint``.

Stochastic rounding (QSGD, TernGrad) needs one uniform per kept value. A GPU kernel
draws it in registers from a counter-based generator: the ``i``-th uniform is a pure
function of ``(seed, i)``, so no state is carried between threads or launches. For
the same spec and seed to give the same bytes on CPU and GPU, the CPU must draw the
very same numbers, which this module does (numba, no triton needed).

The stream
----------
For a 64-bit ``seed`` and element ``i`` (``0 <= i < 2**63``)::

    counter = (i mod 2**32, i >> 32, 0, 0)      key = (seed mod 2**32, seed >> 32)
    r       = first word of Philox4x32 with 10 rounds (Salmon et al., SC 2011)
    u       = (r >> 8) * 2**-24                  # float32 in [0, 1), exact

which is ``tl.randint(seed, i)`` (Triton's ``philox`` with ``n_rounds=10``) followed
by a conversion chosen to be exact in float32: the top 24 bits times a power of two
needs no rounding, so every device gets the same float. (``tl.rand`` converts all 32
bits with a rounding multiply instead; we avoid relying on that.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["PHILOX_ROUNDS", "U24_SCALE", "philox_u32", "philox_uniform", "split_seed"]

PHILOX_ROUNDS = 10
"""Rounds of Philox4x32, as ``tl.randint``'s default (``N_ROUNDS_DEFAULT``)."""

U24_SCALE = np.float32(2.0**-24)
"""``u = (r >> 8) * U24_SCALE``: 24 random bits, exactly representable in float32."""

_ROUND_A = np.uint64(0xD2511F53)
_ROUND_B = np.uint64(0xCD9E8D57)
_KEY_A = np.uint64(0x9E3779B9)
_KEY_B = np.uint64(0xBB67AE85)
_LO32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)

_PARALLEL_ABOVE = 1 << 16
"""Draws below this run on one thread (the thread pool's wake-up costs more)."""


def split_seed(seed: int) -> tuple[int, int]:
    """The Philox key ``(lo, hi)`` of a seed, as ``tl.randint`` splits it.

    Raises
    ------
    ValueError
        If ``seed`` is outside ``[0, 2**63)``: a Triton kernel receives the seed as a
        signed 64-bit argument, so larger values would not reach it unchanged.
    """
    if not 0 <= int(seed) < 1 << 63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return int(seed) & 0xFFFFFFFF, int(seed) >> 32


@njit(cache=True, nogil=True, inline="always")
def _philox_first(c0, c1, k0, k1):  # pragma: no cover - numba
    """First output word of Philox4x32-10 for counter ``(c0, c1, 0, 0)``."""
    c2 = np.uint64(0)
    c3 = np.uint64(0)
    for _ in range(PHILOX_ROUNDS):
        p0 = _ROUND_A * c0  # both factors < 2**32: the product fits 64 bits
        p2 = _ROUND_B * c2
        n0 = (p2 >> _SHIFT32) ^ c1 ^ k0
        n2 = (p0 >> _SHIFT32) ^ c3 ^ k1
        c1 = p2 & _LO32
        c3 = p0 & _LO32
        c0 = n0
        c2 = n2
        k0 = (k0 + _KEY_A) & _LO32
        k1 = (k1 + _KEY_B) & _LO32
    return c0


@njit(cache=True, nogil=True)
def _fill_u32(k0, k1, start, out):  # pragma: no cover - numba
    for j in range(out.shape[0]):
        i = np.uint64(start + j)
        out[j] = _philox_first(i & _LO32, i >> _SHIFT32, k0, k1)


@njit(cache=True, nogil=True)
def _fill_uniform_serial(k0, k1, start, out):  # pragma: no cover - numba
    for j in range(out.shape[0]):
        i = np.uint64(start + j)
        r = _philox_first(i & _LO32, i >> _SHIFT32, k0, k1)
        out[j] = np.float32(r >> np.uint64(8)) * U24_SCALE


@njit(cache=True, parallel=True)
def _fill_uniform_parallel(k0, k1, start, out):  # pragma: no cover - numba
    for j in prange(out.shape[0]):
        i = np.uint64(start + j)
        r = _philox_first(i & _LO32, i >> _SHIFT32, k0, k1)
        out[j] = np.float32(r >> np.uint64(8)) * U24_SCALE


def philox_u32(seed: int, n: int, start: int = 0) -> np.ndarray:
    """``tl.randint(seed, i)`` for ``i`` in ``[start, start + n)``, as uint32."""
    k0, k1 = split_seed(seed)
    out = np.empty(n, dtype=np.uint64)
    _fill_u32(np.uint64(k0), np.uint64(k1), np.int64(start), out)
    return out.astype(np.uint32)


def philox_uniform(seed: int, n: int, start: int = 0) -> np.ndarray:
    """``n`` float32 uniforms in ``[0, 1)``: elements ``start..start+n-1`` of the stream.

    Parameters
    ----------
    seed : int
        The stream's seed, in ``[0, 2**63)`` (what :func:`~fedsync.compression.
        seeding.derive_seed` returns).
    n : int
        How many.
    start : int
        Counter of the first one; a slice of the stream is the slice of the draws.

    Returns
    -------
    numpy.ndarray
        float32, each a multiple of ``2**-24``.
    """
    if n < 0 or start < 0 or start + n > 1 << 63:
        raise ValueError(f"counters [{start}, {start + n}) are outside [0, 2**63)")
    k0, k1 = split_seed(seed)
    out = np.empty(n, dtype=np.float32)
    if n:
        fill = _fill_uniform_serial if n < _PARALLEL_ABOVE else _fill_uniform_parallel
        fill(np.uint64(k0), np.uint64(k1), np.int64(start), out)
    return out
