"""Fused per-chunk uniform quantization on the CPU (numba).

One parallel pass over chunks of the kept values: each chunk's min and max, its
scale ``(max - min) / (2**bits - 1)`` and every code ``rint((v - min) / scale)``, while
the chunk is still in L1. The arithmetic is the torch backend's, operation for
operation (float32 subtract, float32 divide, round-half-to-even, clamp), and runs
without fastmath, so both backends produce the same codes bit for bit.

The scale is computed in float64 and rounded once to float32: ``max - min`` of two
float32 values can overflow float32, the quotient by ``2**bits - 1`` cannot.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["uniform_dequantize", "uniform_quantize"]

_SERIAL_BELOW = 1 << 20
"""Fewer values than this run on one thread: 100k kept values quantize in ~0.1 ms
serially, less than a parallel region's wake-up (see :mod:`kernels.select`)."""


@njit(fastmath={"nnan", "ninf", "nsz"}, cache=True, nogil=True)
def _min_max(vs):  # pragma: no cover - numba
    # The values were checked finite by the caller, so nnan/ninf are true facts here.
    lo = vs[0]
    hi = vs[0]
    for i in range(1, vs.shape[0]):
        v = vs[i]
        lo = min(lo, v)
        hi = max(hi, v)
    return lo, hi


@njit(cache=True, nogil=True)
def _codes(vs, lo, scale, levels, out):  # pragma: no cover - numba
    top = np.float32(levels)
    for i in range(vs.shape[0]):
        q = np.rint((vs[i] - lo) / scale)
        out[i] = np.uint8(min(max(q, np.float32(0.0)), top))


@njit(cache=True, nogil=True)
def _quantize_chunk(values, c, chunk, levels, codes, mins, scales):  # pragma: no cover
    lo_i = c * chunk
    hi_i = min(values.shape[0], lo_i + chunk)
    vs = values[lo_i:hi_i]
    lo, hi = _min_max(vs)
    scale = np.float32((np.float64(hi) - np.float64(lo)) / levels)
    mins[c] = lo
    scales[c] = scale
    if scale > 0:
        _codes(vs, lo, scale, levels, codes[lo_i:hi_i])
    else:
        codes[lo_i:hi_i] = 0


@njit(parallel=True, cache=True)
def _quantize_parallel(values, chunk, levels, codes, mins, scales):  # pragma: no cover
    for c in prange(mins.shape[0]):
        _quantize_chunk(values, c, chunk, levels, codes, mins, scales)


@njit(cache=True, nogil=True)
def _quantize_serial(values, chunk, levels, codes, mins, scales):  # pragma: no cover
    for c in range(mins.shape[0]):
        _quantize_chunk(values, c, chunk, levels, codes, mins, scales)


@njit(cache=True, nogil=True)
def _dequantize(codes, mins, scales, chunk, out):  # pragma: no cover - numba
    # Two roundings, product then sum, never fused into an FMA (no fastmath): the
    # torch backend computes ``code * scale + min`` as two separate ops too.
    for c in range(mins.shape[0]):
        lo_i = c * chunk
        hi_i = min(codes.shape[0], lo_i + chunk)
        lo = mins[c]
        scale = scales[c]
        for i in range(lo_i, hi_i):
            out[i] = np.float32(codes[i]) * scale + lo


def uniform_quantize(
    values: np.ndarray, bits: int, chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, per-chunk minima and per-chunk scales of ``values``.

    Parameters
    ----------
    values : numpy.ndarray
        1-d contiguous float32, all finite.
    bits : int
        Code width, 1 to 8.
    chunk : int
        Values per chunk (each chunk has its own min and scale).

    Returns
    -------
    codes : numpy.ndarray
        uint8, one per value, in ``[0, 2**bits - 1]``.
    mins, scales : numpy.ndarray
        float32, one per chunk (``ceil(len(values) / chunk)``).
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[0]
    nchunks = -(-n // chunk)
    codes = np.empty(n, dtype=np.uint8)
    mins = np.empty(nchunks, dtype=np.float32)
    scales = np.empty(nchunks, dtype=np.float32)
    if n:
        serial = n < _SERIAL_BELOW or numba.get_num_threads() == 1
        kernel = _quantize_serial if serial else _quantize_parallel
        kernel(values, chunk, (1 << bits) - 1, codes, mins, scales)
    return codes, mins, scales


def uniform_dequantize(
    codes: np.ndarray, mins: np.ndarray, scales: np.ndarray, chunk: int
) -> np.ndarray:
    """``code * scale + min`` per chunk, as float32 (shapes checked by the caller)."""
    out = np.empty(codes.shape[0], dtype=np.float32)
    if codes.shape[0]:
        _dequantize(
            np.ascontiguousarray(codes),
            np.ascontiguousarray(mins, dtype=np.float32),
            np.ascontiguousarray(scales, dtype=np.float32),
            chunk,
            out,
        )
    return out
