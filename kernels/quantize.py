"""Quantization kernels on the CPU (numba).

Uniform (:func:`uniform_quantize`): one fused parallel pass over chunks of the kept
values: each chunk's min and max, its scale ``(max - min) / (2**bits - 1)`` and every
code ``rint((v - min) / scale)``, while the chunk is still in L1. The arithmetic is
the torch backend's, operation for operation (float32 subtract, float32 divide,
round-half-to-even, clamp), and runs without fastmath, so both backends produce the
same codes bit for bit. The scale is computed in float64 and rounded once to
float32: ``max - min`` of two float32 values can overflow float32, the quotient by
``2**bits - 1`` cannot.

QSGD, TernGrad and sign (:func:`qsgd_quantize`, :func:`ternary_quantize`,
:func:`sign_quantize`): QSGD and TernGrad round stochastically; sign scales by a float
sum. For the same spec, input and seed to give the same bytes on every device, the
CPU must draw the device's random numbers (:mod:`fedsync.kernels.philox`, a counter-based
generator a GPU thread can evaluate on its own) and add in the device's order
(:mod:`fedsync.kernels.ordered_sums`). These functions are what the CPU backends run for
those quantizers; the Triton kernels in :mod:`fedsync.kernels.triton.quantize` are checked
against them bit for bit.

Every float step of these three is one IEEE float32 operation (no fastmath, so no
contraction into FMAs and no reassociation); the Triton kernels do the same steps
with ``div_rn`` for the divisions and FMA fusion switched off.

QSGD, per kept value ``v`` at position ``i`` of chunk ``c`` (``s`` levels)::

    norm   = float32(sqrt(sum_chunk v*v in index order, float64))
    scaled = float32(|v| / (norm if norm > 0 else 1)) * float32(s)
    u      = philox_uniform(seed)[i]
    level  = clamp(floor(scaled + u), 0, s)
    code   = 2 * level + (v < 0)

Ternary, with ``scale = max |v|``: ``keep = u < float32(|v| / scale)``; code 1 (+) or
2 (-) when kept, else 0. Sign: ``code = (v < 0)``, ``scale = float32(S / n)`` with
``S`` the fixed-order float64 sum of ``|v|``
(:func:`fedsync.kernels.ordered_sums.ordered_abs_sum`).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from fedsync.kernels.ordered_sums import chunk_norms, ordered_abs_sum
from fedsync.kernels.philox import philox_uniform

__all__ = [
    "qsgd_quantize",
    "sign_quantize",
    "ternary_quantize",
    "uniform_dequantize",
    "uniform_quantize",
]

_SERIAL_BELOW = 1 << 20
"""Fewer values than this run on one thread: 100k kept values quantize in ~0.1 ms
serially, less than a parallel region's wake-up (see :mod:`fedsync.kernels.select`)."""


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


_STOCHASTIC_SERIAL_BELOW = 1 << 16
"""Fewer QSGD values than this run on one thread."""


@njit(cache=True, nogil=True, inline="always")
def _qsgd_one(v, norm, s, u):  # pragma: no cover - numba
    safe = norm if norm > np.float32(0.0) else np.float32(1.0)
    scaled = np.float32(abs(v) / safe) * s
    level = np.floor(scaled + u)
    level = min(max(level, np.float32(0.0)), s)
    return np.int64(level) * 2 + (1 if v < np.float32(0.0) else 0)


@njit(cache=True, nogil=True)
def _qsgd_serial(values, norms, chunk, s, u, out):  # pragma: no cover - numba
    for i in range(values.shape[0]):
        out[i] = _qsgd_one(values[i], norms[i // chunk], s, u[i])


@njit(cache=True, parallel=True)
def _qsgd_parallel(values, norms, chunk, s, u, out):  # pragma: no cover - numba
    for i in prange(values.shape[0]):
        out[i] = _qsgd_one(values[i], norms[i // chunk], s, u[i])


def qsgd_quantize(
    values: np.ndarray, levels: int, chunk: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """QSGD codes and per-chunk norms (the arithmetic is in the module docstring).

    Parameters
    ----------
    values : numpy.ndarray
        1-d float32, all finite.
    levels : int
        ``s``, 1 to 32767.
    chunk : int
        Values per norm.
    seed : int
        The Philox stream's seed, in ``[0, 2**63)``.

    Returns
    -------
    codes : numpy.ndarray
        uint8 when ``2 * s + 1 < 256``, else uint16.
    norms : numpy.ndarray
        float32, one per chunk.
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[0]
    norms = chunk_norms(values, chunk)
    dtype = np.uint8 if 2 * levels + 1 < 256 else np.uint16
    codes = np.empty(n, dtype=dtype)
    if n:
        u = philox_uniform(seed, n)
        kernel = _qsgd_serial if n < _STOCHASTIC_SERIAL_BELOW else _qsgd_parallel
        kernel(values, norms, chunk, np.float32(levels), u, codes)
    return codes, norms


@njit(cache=True, nogil=True)
def _ternary(values, scale, u, out):  # pragma: no cover - numba
    for i in range(values.shape[0]):
        v = values[i]
        keep = u[i] < np.float32(abs(v) / scale)
        out[i] = (2 if v < np.float32(0.0) else 1) if keep else 0


def ternary_quantize(values: np.ndarray, seed: int) -> tuple[np.ndarray, np.float32]:
    """TernGrad codes (0, 1 for +, 2 for -) and the scale ``max |v|``."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[0]
    codes = np.zeros(n, dtype=np.uint8)
    scale = np.float32(np.abs(values).max()) if n else np.float32(0.0)
    if n and scale > 0:
        _ternary(values, scale, philox_uniform(seed, n), codes)
    return codes, scale


def sign_quantize(values: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Sign codes (1 for negative) and the scale: the mean magnitude, summed in the
    fixed order of :mod:`fedsync.kernels.ordered_sums`."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[0]
    scale = np.float32(ordered_abs_sum(values) / n) if n else np.float32(0.0)
    return (values < 0).astype(np.uint8), scale
