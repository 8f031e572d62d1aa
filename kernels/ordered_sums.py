"""Float sums in one fixed order, so that CPU and GPU round the same way.

A float64 sum rounds after every addition, so its value depends on the order of the
additions. ``torch.sum``, numba with ``reassoc`` and a GPU tree reduction each pick
their own order (numba's even depends on the thread count), and a threshold or a
scale computed from such a sum can differ in its last bit from device to device,
and with it the bytes on the wire. The sums here follow one order, written down
below, that a GPU can run at memory speed and a CPU can vectorise:

Lane sums (:func:`ordered_abs_moments`), for ``f(x) = |x|`` or ``x * x`` in float64:

1. ``L1 = min(n, LANES)`` lanes; lane ``l`` adds ``f(x[l]), f(x[l + L1]),
   f(x[l + 2 L1]), ...`` one by one, from ``0.0``. On a GPU each thread is a lane
   and every step is one coalesced load; on a CPU the inner loop over lanes is a
   vector loop over contiguous memory.
2. The ``L1`` partials are summed the same way with ``L2 = min(L1, LANES2)``.
3. :func:`math.fsum` of the ``L2`` partials: exactly rounded, so its order does not
   matter.

``x * x`` of a float32 ``x`` is exact in float64 (48 significant bits), so a fused
multiply-add gives the same sum as a multiply then an add.

Chunk sums (:func:`chunk_sumsq`) for QSGD's per-chunk norms: each chunk of ``chunk``
consecutive values adds ``v * v`` in index order, from ``0.0``; the norm is the
float64 square root rounded once to float32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = [
    "LANES",
    "LANES2",
    "chunk_norms",
    "chunk_sumsq",
    "finish_partials",
    "finish_second",
    "lane_partials",
    "ordered_abs_moments",
    "ordered_abs_sum",
    "ordered_moments",
]

LANES = 1 << 18
"""Lanes of the first stage: 256 programs of 1024 threads on a GPU, enough to keep
HBM busy; 2 MiB of float64 partials per sum."""

LANES2 = 1 << 10
"""Lanes of the second stage; their partials go to the host for :func:`math.fsum`."""

_SERIAL_BELOW = 1 << 17
"""Inputs shorter than this run on one thread."""

_TILE = 64
"""Lanes one CPU loop iteration carries in registers (the accumulators never touch
memory until the tile is done, so the pass is bound by reading ``x``)."""


@njit(cache=True, nogil=True)
def _lane_tile(x, lanes, t0, signed, out_abs, out_sq):  # pragma: no cover - numba
    """Lanes ``t0 .. t0 + _TILE - 1`` (those below ``lanes``) of stage 1, both sums
    (of ``x`` itself when ``signed``, else of ``|x|``)."""
    n = x.shape[0]
    width = min(_TILE, lanes - t0)
    a1 = np.zeros(_TILE)
    a2 = np.zeros(_TILE)
    for j in range(-(-n // lanes)):
        base = j * lanes + t0
        top = min(width, n - base)
        for i in range(max(top, 0)):
            a = np.float64(x[base + i])
            a1[i] += a if signed else abs(a)
            a2[i] += a * a
    for i in range(width):
        out_abs[t0 + i] = a1[i]
        out_sq[t0 + i] = a2[i]


@njit(cache=True, nogil=True)
def _lanes_serial(x, lanes, signed, out_abs, out_sq):  # pragma: no cover - numba
    for t in range(-(-lanes // _TILE)):
        _lane_tile(x, lanes, t * _TILE, signed, out_abs, out_sq)


@njit(cache=True, parallel=True)
def _lanes_parallel(x, lanes, signed, out_abs, out_sq):  # pragma: no cover - numba
    # Threads own disjoint lane tiles: each lane's order of additions is unchanged.
    for t in prange(-(-lanes // _TILE)):
        _lane_tile(x, lanes, t * _TILE, signed, out_abs, out_sq)


@njit(cache=True, nogil=True)
def _lanes_plain(x, lanes, out):  # pragma: no cover - numba
    """Second stage: plain sums of float64 partials (``f`` is the identity)."""
    n = x.shape[0]
    for l_ in range(lanes):
        out[l_] = 0.0
    steps = -(-n // lanes)
    for j in range(steps):
        base = j * lanes
        top = min(lanes, n - base)
        for l_ in range(top):
            out[l_] += x[base + l_]


def lane_partials(
    x: np.ndarray, lanes: int = LANES, signed: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 of the lane sums of ``|x|`` (or ``x`` when ``signed``) and ``x * x``:
    ``min(n, lanes)`` float64 partials each, from one read of ``x`` (1-d contiguous
    float32 or float64). ``lanes`` is :data:`LANES` on the wire; tests pass fewer to
    walk many steps on small inputs."""
    n = x.shape[0]
    lanes = min(n, lanes)
    out_abs = np.empty(lanes, dtype=np.float64)
    out_sq = np.empty(lanes, dtype=np.float64)
    if n == 0:
        return out_abs, out_sq
    kernel = _lanes_serial if n < _SERIAL_BELOW else _lanes_parallel
    kernel(x, lanes, signed, out_abs, out_sq)
    return out_abs, out_sq


def finish_partials(partials: np.ndarray, lanes2: int = LANES2) -> float:
    """Stages 2 and 3 of the lane sums, from the stage-1 partials."""
    partials = np.ascontiguousarray(partials, dtype=np.float64)
    if partials.shape[0] == 0:
        return 0.0
    lanes = min(partials.shape[0], lanes2)
    second = np.empty(lanes, dtype=np.float64)
    _lanes_plain(partials, lanes, second)
    return finish_second(second)


def finish_second(second: np.ndarray) -> float:
    """Stage 3: the exactly rounded sum of the stage-2 partials.

    ``math.fsum`` raises on an infinite overflow mix and returns NaN for NaN input;
    a non-finite partial makes the sum non-finite here, like a plain sum would.
    """
    if not np.isfinite(second).all():
        return float(second.sum())
    return math.fsum(second.tolist())


def ordered_abs_moments(
    x: np.ndarray, lanes: int = LANES, lanes2: int = LANES2
) -> tuple[float, float]:
    """``(sum |x|, sum x**2)`` of a 1-d float32 array, each in the fixed order of the
    module docstring (non-finite iff some entry is)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    p_abs, p_sq = lane_partials(x, lanes)
    return finish_partials(p_abs, lanes2), finish_partials(p_sq, lanes2)


def ordered_moments(x: np.ndarray, lanes: int = LANES, lanes2: int = LANES2) -> tuple[float, float]:
    """``(sum x, sum x**2)`` of a 1-d float32 or float64 array in the fixed order.

    For float64 input ``x * x`` rounds; it is a product then a sum, never an FMA, on
    every device (SIDCo's later stages fit the exceedances with these).
    """
    x = np.ascontiguousarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    p_sum, p_sq = lane_partials(x, lanes, signed=True)
    return finish_partials(p_sum, lanes2), finish_partials(p_sq, lanes2)


def ordered_abs_sum(x: np.ndarray, lanes: int = LANES, lanes2: int = LANES2) -> float:
    """``sum |x|`` in the fixed order (the sign quantizer's scale numerator)."""
    return ordered_abs_moments(x, lanes, lanes2)[0]


@njit(cache=True, nogil=True)
def _chunk_sumsq_one(v, lo, hi):  # pragma: no cover - numba
    acc = 0.0
    for i in range(lo, hi):
        a = np.float64(v[i])
        acc += a * a
    return acc


@njit(cache=True, parallel=True)
def _chunk_sumsq(v, chunk, out):  # pragma: no cover - numba
    n = v.shape[0]
    for c in prange(out.shape[0]):
        out[c] = _chunk_sumsq_one(v, c * chunk, min(n, (c + 1) * chunk))


def chunk_sumsq(values: np.ndarray, chunk: int) -> np.ndarray:
    """Per chunk of ``chunk`` values, ``sum v * v`` in float64, in index order."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    values = np.ascontiguousarray(values, dtype=np.float32)
    out = np.empty(-(-values.shape[0] // chunk), dtype=np.float64)
    if out.shape[0]:
        _chunk_sumsq(values, chunk, out)
    return out


def chunk_norms(values: np.ndarray, chunk: int) -> np.ndarray:
    """QSGD's per-chunk L2 norms: :func:`chunk_sumsq`, square root, one float32 rounding."""
    return np.sqrt(chunk_sumsq(values, chunk)).astype(np.float32)
