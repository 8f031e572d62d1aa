"""The CPU twins of the device quantizers: the same arithmetic, op for op.

QSGD and TernGrad round stochastically; sign scales by a float sum. For the same
spec, input and seed to give the same bytes on every device, the CPU must draw the
device's random numbers (:mod:`.philox`, a counter-based generator a GPU thread can
evaluate on its own) and add in the device's order (:mod:`.ordered`). These
functions are what the CPU backend runs for those quantizers; the Triton kernels in
:mod:`.quantize` are checked against them bit for bit.

Every float step below is one IEEE float32 operation (no fastmath, so no
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
``S`` the fixed-order float64 sum of ``|v|`` (:func:`.ordered.ordered_abs_sum`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels.triton.ordered import chunk_norms, ordered_abs_sum
from kernels.triton.philox import philox_uniform

__all__ = ["qsgd_quantize", "sign_quantize", "ternary_quantize"]

_SERIAL_BELOW = 1 << 16


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
    """QSGD codes and per-chunk norms (module docstring).

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
        kernel = _qsgd_serial if n < _SERIAL_BELOW else _qsgd_parallel
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
    fixed order of :mod:`.ordered`."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[0]
    scale = np.float32(ordered_abs_sum(values) / n) if n else np.float32(0.0)
    return (values < 0).astype(np.uint8), scale
