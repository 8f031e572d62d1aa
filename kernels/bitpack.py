"""Pack and unpack unsigned integers of a fixed bit width (1..56) into bytes.

Bit order is little-endian throughout: value ``i`` occupies bits
``[i * width, (i + 1) * width)`` of the stream, and bit ``j`` of the stream is bit
``j % 8`` of byte ``j // 8``. The final byte's unused high bits are zero.

The kernels are serial and release the GIL (``nogil``): measured on the 2-core CI
box, numba's threaded variant (groups of eight values fill exactly ``width`` bytes,
so it splits cleanly) was slower than the serial loop even at 10M values (memory
bound, plus a launch cost of 0.05-8 ms depending on the OpenMP wait policy). A server
gets its parallelism by decoding several updates on several threads instead.

The kernels do no bounds checks (numba does none either): :func:`pack_bits` and
:func:`unpack_bits` are the checked entry points and size every buffer themselves.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["MAX_WIDTH", "pack_bits", "packed_nbytes", "unpack_bits"]

MAX_WIDTH = 56
"""Widest value the kernels handle: a value plus the < 8 bits pending in the 64-bit
accumulator must fit 64 bits."""


def packed_nbytes(count: int, width: int) -> int:
    """Bytes that ``count`` values of ``width`` bits occupy."""
    return (count * width + 7) // 8


@njit(cache=True, nogil=True)
def _pack_range(values, lo, hi, width, out, pos):  # pragma: no cover - numba
    mask = (np.uint64(1) << np.uint64(width)) - np.uint64(1)
    acc = np.uint64(0)
    nacc = 0
    for i in range(lo, hi):
        acc |= (np.uint64(values[i]) & mask) << np.uint64(nacc)
        nacc += width
        while nacc >= 8:
            out[pos] = np.uint8(acc & np.uint64(0xFF))
            pos += 1
            acc >>= np.uint64(8)
            nacc -= 8
    if nacc > 0:
        out[pos] = np.uint8(acc & np.uint64(0xFF))


@njit(cache=True, nogil=True)
def _unpack_range(buf, lo, hi, width, out, pos):  # pragma: no cover - numba
    mask = (np.uint64(1) << np.uint64(width)) - np.uint64(1)
    acc = np.uint64(0)
    nacc = 0
    for i in range(lo, hi):
        while nacc < width:
            acc |= np.uint64(buf[pos]) << np.uint64(nacc)
            pos += 1
            nacc += 8
        out[i] = acc & mask
        acc >>= np.uint64(width)
        nacc -= width


@njit(cache=True, nogil=True)
def _pack_serial(values, width, out):  # pragma: no cover - numba
    _pack_range(values, 0, values.shape[0], width, out, 0)


@njit(cache=True, nogil=True)
def _unpack_serial(buf, width, out):  # pragma: no cover - numba
    _unpack_range(buf, 0, out.shape[0], width, out, 0)


def _check_width(width: int) -> None:
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be in 1..{MAX_WIDTH}, got {width}")


def _byte_aligned_dtype(width: int) -> np.dtype | None:
    """The little-endian dtype whose raw bytes already are the packed stream."""
    aligned: dict[int, np.dtype] = {8: np.dtype("<u1"), 16: np.dtype("<u2"), 32: np.dtype("<u4")}
    return aligned.get(width)


def pack_bits(values: np.ndarray, width: int) -> np.ndarray:
    """Pack unsigned integers into a little-endian bit stream.

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional unsigned integer array; each value must be below
        ``2**width`` (bits above ``width`` are dropped, not checked: callers validate).
    width : int
        Bits per value, 1 to :data:`MAX_WIDTH`.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of ``packed_nbytes(len(values), width)`` bytes.
    """
    _check_width(width)
    if values.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {values.shape}")
    aligned = _byte_aligned_dtype(width)
    if aligned is not None:
        # Whole-byte widths need no shifting: the little-endian bytes are the stream.
        return np.ascontiguousarray(values, dtype=aligned).view(np.uint8)
    if values.dtype.kind != "u":
        raise ValueError(f"values must be unsigned integers, got dtype {values.dtype}")
    values = np.ascontiguousarray(values)
    out = np.zeros(packed_nbytes(values.shape[0], width), dtype=np.uint8)
    _pack_serial(values, width, out)
    return out


def unpack_bits(buf: np.ndarray, count: int, width: int, dtype: np.dtype | type) -> np.ndarray:
    """Unpack ``count`` values of ``width`` bits from a little-endian bit stream.

    Parameters
    ----------
    buf : numpy.ndarray
        ``uint8`` array holding at least ``packed_nbytes(count, width)`` bytes;
        checked here because the kernels read without bounds checks.
    count : int
        Number of values.
    width : int
        Bits per value, 1 to :data:`MAX_WIDTH`.
    dtype : numpy.dtype
        Unsigned output dtype, wide enough for ``width`` bits.

    Returns
    -------
    numpy.ndarray
        ``count`` values of ``dtype``.
    """
    _check_width(width)
    dtype = np.dtype(dtype)
    if dtype.kind != "u" or dtype.itemsize * 8 < width:
        raise ValueError(f"dtype {dtype} cannot hold {width}-bit values")
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    nbytes = packed_nbytes(count, width)
    if buf.dtype != np.uint8 or buf.ndim != 1 or buf.shape[0] < nbytes:
        raise ValueError(
            f"buf must be a 1-d uint8 array of at least {nbytes} bytes, "
            f"got {buf.dtype} of shape {buf.shape}"
        )
    buf = np.ascontiguousarray(buf[:nbytes])
    aligned = _byte_aligned_dtype(width)
    if aligned is not None:
        return buf.view(aligned).astype(dtype)
    out = np.empty(count, dtype=dtype)
    _unpack_serial(buf, width, out)
    return out
