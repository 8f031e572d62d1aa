"""A context-modelled, arithmetic-coded bitmap of kept positions (numba).

Top-k supports of real updates are clustered: a kept weight's row and column
neighbours are kept far more often than the density says (whole filters, output
units, input features). This coding spends bits where the support is surprising.
The tensor is viewed as ``rows x width`` (``rows = shape[0]`` for two or more
dimensions, else one row), and every position's bit is coded, in order, with the
probability its context has shown so far:

* ``l1``, ``l2`` -- the two positions to the left in the same row;
* ``u`` -- the position above (previous row, same column); ``d`` -- either
  diagonal above (``ul | ur``);
* ``qc`` -- how many of the rows above kept this column: 0, 1, 2-3, 4 or more;
* ``qr`` -- how many positions this row has kept so far: 0, 1-2, 3 or more.

That is ``2 * 2 * 2 * 2 * 4 * 3 = 192`` contexts, each with adaptive counts
``(n0, n1)`` starting at zero; the probability of a one is the Krichevsky-Trofimov
estimate ``(n1 + 1/2) / (n0 + n1 + 1)`` in 16-bit fixed point (clamped to
``[1, 65535] / 65536``), and both counts halve when their sum reaches ``2**15``.

The bits drive a binary range coder (32-bit range, carry propagation through a
cached byte, as in the classic LZMA design): coding a one keeps the low
``(range >> 16) * p1`` of the interval, a zero the rest; the range is renormalised
a byte at a time below ``2**24``. The encoder flushes five bytes and drops the
first output byte (always zero), so the decoder starts by reading four and, for a
valid section, has read exactly every byte when the last bit is decoded: reading
past the end, bytes left over, a code outside the range, or a count of ones that
disagrees with the declared count are all faults the decoder reports.

Work is ``O(numel)`` bit steps and memory ``3 * width`` bytes plus the 192 context
counts, so callers bound ``numel`` before using it
(:data:`fedsync.wire.index_coding.CONTEXT_MAX_NUMEL`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from fedsync.kernels.index_coding import (
    STATUS_EXTRA_BITS,
    STATUS_OK,
    STATUS_TRUNCATED,
)

__all__ = [
    "N_CONTEXTS",
    "STATUS_BAD_CODE",
    "STATUS_FEW_ONES",
    "STATUS_TRAILING",
    "context_decode",
    "context_encode",
    "neighbour_pairs",
]

N_CONTEXTS = 192
STATUS_BAD_CODE = 10
"""The decoder's code value left the coder's range: not a valid stream."""
STATUS_FEW_ONES = 11
"""The bitmap decoded to fewer ones than the declared count."""
STATUS_TRAILING = 12
"""The bitmap was complete before the section's last byte."""

_TOP = 1 << 24
_MASK32 = 0xFFFFFFFF
_HALVE_AT = 1 << 15


@njit(cache=True, nogil=True, inline="always")
def _context(cur, prev, col, c, width, rowc):  # pragma: no cover - numba
    l1 = cur[c - 1] if c >= 1 else 0
    l2 = cur[c - 2] if c >= 2 else 0
    u = prev[c]
    d = (prev[c - 1] if c >= 1 else 0) | (prev[c + 1] if c + 1 < width else 0)
    q = col[c]
    qc = 0 if q == 0 else (1 if q == 1 else (2 if q < 4 else 3))
    qr = 0 if rowc == 0 else (1 if rowc < 3 else 2)
    return (l1 | (l2 << 1) | (u << 2) | (d << 3) | (qc << 4)) * 3 + qr


@njit(cache=True, nogil=True, inline="always")
def _p1(n0, n1):  # pragma: no cover - numba
    p = ((2 * n1 + 1) << 16) // (2 * (n0 + n1) + 2)
    return min(max(p, 1), 65535)


@njit(cache=True, nogil=True, inline="always")
def _update(n0, n1, ctx, bit):  # pragma: no cover - numba
    if bit:
        n1[ctx] += 1
    else:
        n0[ctx] += 1
    if n0[ctx] + n1[ctx] >= _HALVE_AT:
        n0[ctx] = (n0[ctx] + 1) >> 1
        n1[ctx] = (n1[ctx] + 1) >> 1


@njit(cache=True, nogil=True)
def context_encode(indices, rows, width, out):  # pragma: no cover - numba
    """Code the bitmap of sorted ``indices`` (``rows * width`` positions) into ``out``.

    Returns the section length in bytes, or ``-1`` when it would not fit ``out``
    (callers size ``out`` to the largest section worth keeping, so ``-1`` means
    "another coding is smaller").
    """
    n0 = np.zeros(N_CONTEXTS, dtype=np.int64)
    n1 = np.zeros(N_CONTEXTS, dtype=np.int64)
    cur = np.zeros(width + 1, dtype=np.uint8)
    prev = np.zeros(width + 1, dtype=np.uint8)
    col = np.zeros(width, dtype=np.uint8)
    low = 0
    rng = _MASK32
    cache = 0
    cache_size = 1
    pos = 0  # bytes written, the always-zero first byte included
    cap = out.shape[0] + 1
    nxt = 0
    n = indices.shape[0]
    next_one = indices[0] if n > 0 else -1
    for r in range(rows):
        rowc = 0
        base = r * width
        for c in range(width):
            bit = 1 if base + c == next_one else 0
            if bit:
                nxt += 1
                next_one = indices[nxt] if nxt < n else -1
            ctx = _context(cur, prev, col, c, width, rowc)
            bound = (rng >> 16) * _p1(n0[ctx], n1[ctx])
            if bit:
                rng = bound
            else:
                low += bound
                rng -= bound
            _update(n0, n1, ctx, bit)
            cur[c] = bit
            if bit:
                rowc += 1
                if col[c] < 4:
                    col[c] += 1
            while rng < _TOP:
                rng = (rng << 8) & _MASK32
                pos, low, cache, cache_size = _shift_low(out, cap, pos, low, cache, cache_size)
                if pos < 0:
                    return -1
        cur, prev = prev, cur
        cur[:] = 0
    for _ in range(5):
        pos, low, cache, cache_size = _shift_low(out, cap, pos, low, cache, cache_size)
        if pos < 0:
            return -1
    return pos - 1


@njit(cache=True, nogil=True, inline="always")
def _shift_low(out, cap, pos, low, cache, cache_size):  # pragma: no cover - numba
    """The range coder's byte output: emit the cached byte (plus carry) once the top
    byte of ``low`` has settled. Returns ``(pos, low, cache, cache_size)``; ``pos`` is
    -1 when ``out`` (``cap`` bytes) is full."""
    if low < 0xFF000000 or low > _MASK32:
        carry = low >> 32
        temp = cache
        while True:
            if pos >= cap:
                return -1, low, cache, cache_size
            if pos > 0:
                out[pos - 1] = (temp + carry) & 0xFF
            pos += 1
            temp = 0xFF
            cache_size -= 1
            if cache_size == 0:
                break
        cache = (low >> 24) & 0xFF
    cache_size += 1
    low = (low & 0x00FFFFFF) << 8
    return pos, low, cache, cache_size


@njit(cache=True, nogil=True)
def context_decode(section, count, rows, width, out):  # pragma: no cover - numba
    """Decode a section into ``count`` sorted positions in ``out``.

    Returns ``(status, position, detail)``: ``STATUS_OK``; ``STATUS_TRUNCATED``
    (the stream needs a byte past the section's end; ``position`` ones so far);
    ``STATUS_EXTRA_BITS`` (more ones than ``count``; ``detail`` the position);
    ``STATUS_FEW_ONES``; ``STATUS_TRAILING`` (``detail`` bytes read);
    ``STATUS_BAD_CODE``. Never reads outside ``section`` nor writes outside ``out``.
    """
    size = section.shape[0]
    if size < 4:
        return STATUS_TRUNCATED, 0, 0
    n0 = np.zeros(N_CONTEXTS, dtype=np.int64)
    n1 = np.zeros(N_CONTEXTS, dtype=np.int64)
    cur = np.zeros(width + 1, dtype=np.uint8)
    prev = np.zeros(width + 1, dtype=np.uint8)
    col = np.zeros(width, dtype=np.uint8)
    rng = _MASK32
    code = 0
    for i in range(4):
        code = (code << 8) | int(section[i])
    read = 4
    ones = 0
    for r in range(rows):
        rowc = 0
        base = r * width
        for c in range(width):
            if code >= rng:
                return STATUS_BAD_CODE, ones, base + c
            ctx = _context(cur, prev, col, c, width, rowc)
            bound = (rng >> 16) * _p1(n0[ctx], n1[ctx])
            if code < bound:
                rng = bound
                bit = 1
            else:
                code -= bound
                rng -= bound
                bit = 0
            _update(n0, n1, ctx, bit)
            cur[c] = bit
            if bit:
                if ones >= count:
                    return STATUS_EXTRA_BITS, ones, base + c
                out[ones] = base + c
                ones += 1
                rowc += 1
                if col[c] < 4:
                    col[c] += 1
            while rng < _TOP:
                if read >= size:
                    return STATUS_TRUNCATED, ones, base + c
                rng = (rng << 8) & _MASK32
                code = ((code << 8) | int(section[read])) & _MASK32
                read += 1
        cur, prev = prev, cur
        cur[:] = 0
    if ones < count:
        return STATUS_FEW_ONES, ones, 0
    if read != size:
        return STATUS_TRAILING, ones, read
    return STATUS_OK, ones, 0


@njit(cache=True, nogil=True)
def neighbour_pairs(indices, width, columns):  # pragma: no cover - numba
    """The cheap test of whether a support is clustered at all, ``O(count)`` (plus
    ``O(width)`` with ``columns``, which callers allow only for ``width`` in
    proportion to the count).

    Returns ``(left, up, cells, ones)``: kept positions whose left neighbour (same
    row) is kept, those whose upper neighbour (``width`` before) is kept, and, with
    ``columns``, over every column the positions below the column's first kept one
    (``cells``) and how many of them are kept (``ones``); else zeros.
    """
    n = indices.shape[0]
    left = 0
    up = 0
    j = 0
    span = width if columns else 0
    first = np.full(span, -1, dtype=np.int64)
    hits = np.zeros(span, dtype=np.int64)
    rows = (indices[n - 1] // width + 1) if n > 0 else 0
    for i in range(n):
        x = indices[i]
        if i > 0 and indices[i - 1] == x - 1 and x % width != 0:
            left += 1
        target = x - width
        if target >= 0:
            while j < i and indices[j] < target:
                j += 1
            if j < i and indices[j] == target:
                up += 1
        if columns:
            c = x % width
            if first[c] < 0:
                first[c] = x // width
            hits[c] += 1
    cells = 0
    ones = 0
    for c in range(span):
        if first[c] >= 0:
            cells += rows - 1 - first[c]
            ones += hits[c] - 1
    return left, up, cells, ones
