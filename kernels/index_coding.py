"""Numba kernels for coding sorted, unique positions of a flat tensor.

Three codings of a strictly increasing index set ``x_0 < x_1 < ... < x_{n-1}`` in
``[0, numel)``; all bit streams are little-endian (bit ``j`` is bit ``j % 8`` of byte
``j // 8``):

* **bitmap** -- ``numel`` bits, bit ``x_i`` set.
* **Rice** -- the gaps ``g_0 = x_0`` and ``g_i = x_i - x_{i-1} - 1`` (all >= 0), each
  as the quotient ``g >> k`` in unary (that many 0 bits, then a 1 bit) followed by
  the ``k`` low bits of ``g``. A Golomb code with a power-of-two parameter: for
  geometric gaps (a random support) the best ``k`` is within a few percent of the
  entropy, and decoding needs only shifts and masks.
* **Elias-Fano** -- the ``L`` low bits of every ``x_i`` packed at ``L`` bits each
  (see :mod:`fedsync.kernels.bitpack`), and the high parts ``h_i = x_i >> L`` as a bit
  array of ``n + ((numel - 1) >> L)`` bits with bit ``h_i + i`` set.

The decoders are written for hostile input: every loop is bounded by a size the
caller validated, every read stays inside a buffer the caller padded, and instead
of raising (numba cannot raise rich errors cheaply) they return a status code plus
the position of the fault, which :mod:`fedsync.wire.index_coding` turns into a
typed error. Input contracts are stated per kernel; the Python layer checks them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "READ_PAD_BYTES",
    "STATUS_EXTRA_BITS",
    "STATUS_OK",
    "STATUS_OUT_OF_RANGE",
    "STATUS_TRUNCATED",
    "STATUS_UNORDERED",
    "bitmap_decode",
    "bitmap_encode",
    "ef_decode",
    "ef_encode_high",
    "first_bad_index",
    "popcount",
    "rice_decode",
    "rice_encode",
    "rice_encode_words",
    "rice_shift_sum",
]

STATUS_OK = 0
STATUS_TRUNCATED = 1
"""The stream ended before all positions were decoded (a unary run that never ends,
too few set bits)."""
STATUS_OUT_OF_RANGE = 2
"""A decoded position is >= numel."""
STATUS_UNORDERED = 3
"""A decoded position is not greater than the one before it."""
STATUS_EXTRA_BITS = 4
"""Set bits beyond the last position (too many ones, nonzero padding)."""

READ_PAD_BYTES = 8
"""Zero bytes a decoder's input must carry past its last real byte: the 64-bit
window reads up to 8 bytes at any real byte offset."""

_POPCOUNT8 = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint8)
_CTZ8 = np.array([(b & -b).bit_length() - 1 if b else 8 for b in range(256)], dtype=np.uint8)


@njit(cache=True, nogil=True)
def first_bad_index(indices, numel):  # pragma: no cover - numba
    """Return the first ``i`` where ``indices`` stops being strictly increasing in
    ``[0, numel)``, or -1 when the whole array is valid."""
    prev = -1
    for i in range(indices.shape[0]):
        x = indices[i]
        if x <= prev or x >= numel:
            return i
        prev = x
    return -1


@njit(cache=True, nogil=True)
def rice_shift_sum(indices, k):  # pragma: no cover - numba
    """Sum of ``g_i >> k`` over the gaps: the unary bits of a Rice code with
    parameter ``k`` (the code is ``n * (k + 1)`` plus this many bits).

    ``indices`` must be strictly increasing and non-negative."""
    total = 0
    prev = -1
    for i in range(indices.shape[0]):
        x = indices[i]
        total += (x - prev - 1) >> k
        prev = x
    return total


@njit(cache=True, nogil=True)
def _load64(buf, byte):  # pragma: no cover - numba
    """Little-endian 64-bit word at ``byte``; ``buf`` must extend 8 bytes past it."""
    word = np.uint64(0)
    for j in range(8):
        word |= np.uint64(buf[byte + j]) << np.uint64(8 * j)
    return word


@njit(cache=True, nogil=True)
def rice_encode(indices, k, out):  # pragma: no cover - numba
    """Write the Rice code of ``indices`` into the zeroed ``out``; return its bit
    length.

    ``indices`` must be strictly increasing and non-negative, ``0 <= k <= 56``, and
    ``out`` must hold ``ceil(bits / 8)`` bytes (``bits`` from
    :func:`rice_shift_sum`). Bits gather in a 64-bit accumulator that is flushed a
    byte at a time, so each position costs a shift, an OR and about one store.
    """
    low_mask = (1 << k) - 1
    acc = np.uint64(0)
    nacc = 0
    byte = 0
    prev = -1
    for i in range(indices.shape[0]):
        x = indices[i]
        gap = x - prev - 1
        prev = x
        # Unary quotient: that many zero bits. Pending bits go out first, then whole
        # zero bytes are skipped (``out`` is already zeroed).
        nacc += gap >> k
        while nacc >= 8 and acc != np.uint64(0):
            out[byte] = np.uint8(acc & np.uint64(0xFF))
            byte += 1
            acc >>= np.uint64(8)
            nacc -= 8
        byte += nacc >> 3
        nacc &= 7
        # The terminating one bit, then the k low bits: k + 1 <= 57 bits on top of
        # fewer than 8 pending bits fits the accumulator.
        acc |= np.uint64(1 | ((gap & low_mask) << 1)) << np.uint64(nacc)
        nacc += k + 1
        while nacc >= 8:
            out[byte] = np.uint8(acc & np.uint64(0xFF))
            byte += 1
            acc >>= np.uint64(8)
            nacc -= 8
    if nacc > 0:
        out[byte] = np.uint8(acc & np.uint64(0xFF))
    return byte * 8 + nacc


RICE_WORDS_MAX_K = 30
"""Largest Rice parameter :func:`rice_encode_words` takes: fewer than 32 pending bits
plus a ``k + 1``-bit code must fit its 64-bit accumulator."""


@njit(cache=True, nogil=True)
def rice_encode_words(indices, k, words):  # pragma: no cover - numba
    """:func:`rice_encode` into zeroed little-endian 32-bit ``words``; return the bit
    length. The same stream: ``words`` viewed as bytes (on a little-endian host) equals
    :func:`rice_encode`'s ``out``.

    Flushing whole 32-bit words instead of bytes makes the common code (a few unary
    bits and ``k + 1`` more) cost one compare-and-store per ~4 codes: 2.3x faster
    than the byte loop (measured: 100k positions of 10M, 0.45 -> 0.20 ms). Needs
    ``0 <= k <= RICE_WORDS_MAX_K`` and ``ceil(bits / 32) + 1`` words.
    """
    low_mask = np.int64((1 << k) - 1)
    acc = np.uint64(0)
    nacc = np.int64(0)
    w = 0
    prev = np.int64(-1)
    for i in range(indices.shape[0]):
        x = indices[i]
        gap = x - prev - 1
        prev = x
        # Unary quotient: zeros. A run that reaches the next word boundary flushes the
        # pending bits and skips whole zero words (``words`` is already zeroed).
        nacc += gap >> k
        if nacc >= 32:
            words[w] = np.uint32(acc & np.uint64(0xFFFFFFFF))
            nacc -= 32
            w += 1 + (nacc >> 5)
            nacc &= 31
            acc = np.uint64(0)
        # The terminating one bit and the k low bits: nacc <= 31 + 31 < 64.
        acc |= np.uint64(1 | ((gap & low_mask) << 1)) << np.uint64(nacc)
        nacc += k + 1
        if nacc >= 32:
            words[w] = np.uint32(acc & np.uint64(0xFFFFFFFF))
            w += 1
            acc >>= np.uint64(32)
            nacc -= 32
    if nacc > 0:
        words[w] = np.uint32(acc & np.uint64(0xFFFFFFFF))
    return w * 32 + nacc


@njit(cache=True, nogil=True)
def rice_decode(buf, nbits, k, numel, out):  # pragma: no cover - numba
    """Decode ``out.shape[0]`` positions from a Rice stream of at most ``nbits`` bits.

    Returns ``(status, i, detail)``: on success ``(STATUS_OK, n, bits_read)``;
    otherwise the failing position ``i`` and, for ``STATUS_TRUNCATED``, the bit
    offset reached, for ``STATUS_OUT_OF_RANGE``, the least value the position could
    have had.

    Contract: ``buf`` holds ``ceil(nbits / 8) + READ_PAD_BYTES`` bytes, the padding
    zero; ``0 <= k <= 56``; ``numel < 2**56``. Each unary run is cut off as soon as
    it passes the end of the stream or implies a position >= ``numel``, so the work
    is bounded by ``nbits / 57 + n`` window loads whatever the bytes say.
    """
    low_mask = np.uint64((1 << k) - 1)
    pos = 0
    prev = -1
    n = out.shape[0]
    for i in range(n):
        # Largest quotient that keeps the position below numel.
        room = numel - prev - 2
        if room < 0:
            return STATUS_OUT_OF_RANGE, i, prev + 1
        q_max = room >> k
        q = 0
        t = 0
        word = np.uint64(0)
        while True:
            if pos >= nbits:
                return STATUS_TRUNCATED, i, pos
            # At least 57 valid bits: 64 minus the (pos & 7) already consumed.
            word = _load64(buf, pos >> 3) >> np.uint64(pos & 7)
            if word == np.uint64(0):
                q += 57
                pos += 57
                if q > q_max:
                    return STATUS_OUT_OF_RANGE, i, prev + 1 + ((q_max + 1) << k)
                continue
            t = 0
            while (word & np.uint64(0xFF)) == np.uint64(0):
                word >>= np.uint64(8)
                t += 8
            t += _CTZ8[word & np.uint64(0xFF)]
            word >>= np.uint64(t & 7)  # now the one bit is bit 0
            q += t
            if q > q_max:
                return STATUS_OUT_OF_RANGE, i, prev + 1 + ((q_max + 1) << k)
            pos += t + 1
            break
        # (The one bit cannot lie in the zero padding, so pos <= nbits here.)
        if pos + k > nbits:
            return STATUS_TRUNCATED, i, pos
        low = np.int64(0)
        if k > 0:
            # The window held >= 57 stream bits; if the one bit and the k low bits
            # are among them, reuse it instead of loading again.
            if t + 1 + k <= 57:
                low = np.int64((word >> np.uint64(1)) & low_mask)
            else:
                low = np.int64((_load64(buf, pos >> 3) >> np.uint64(pos & 7)) & low_mask)
            pos += k
        x = prev + 1 + ((q << k) | low)
        if x >= numel:
            return STATUS_OUT_OF_RANGE, i, x
        out[i] = x
        prev = x
    return STATUS_OK, n, pos


@njit(cache=True, nogil=True)
def bitmap_encode(indices, out):  # pragma: no cover - numba
    """Set bit ``x`` of the zeroed ``out`` for every ``x`` in ``indices``
    (contract: ``0 <= x < 8 * out.shape[0]``)."""
    for i in range(indices.shape[0]):
        x = indices[i]
        out[x >> 3] |= np.uint8(1 << (x & 7))


@njit(cache=True, nogil=True)
def popcount(buf):  # pragma: no cover - numba
    """Number of set bits in the byte array ``buf``."""
    total = 0
    for j in range(buf.shape[0]):
        total += _POPCOUNT8[buf[j]]
    return total


@njit(cache=True, nogil=True)
def bitmap_decode(buf, out):  # pragma: no cover - numba
    """Write the positions of the set bits of ``buf`` into ``out``, in order.

    Returns ``(status, i, detail)``: ``(STATUS_OK, n, 0)`` when exactly
    ``out.shape[0]`` bits are set; ``STATUS_EXTRA_BITS`` with the position of the
    first surplus bit; ``STATUS_TRUNCATED`` with the number found when too few are.
    Never writes past ``out``."""
    n = out.shape[0]
    found = 0
    for j in range(buf.shape[0]):
        b = np.int64(buf[j])
        while b != 0:
            if found >= n:
                return STATUS_EXTRA_BITS, found, j * 8 + _CTZ8[b]
            out[found] = j * 8 + _CTZ8[b]
            found += 1
            b &= b - 1
    if found < n:
        return STATUS_TRUNCATED, found, found
    return STATUS_OK, n, 0


@njit(cache=True, nogil=True)
def ef_encode_high(indices, low_bits, out):  # pragma: no cover - numba
    """Set bit ``(x_i >> low_bits) + i`` of the zeroed ``out`` for every ``i``.

    Contract: ``indices`` strictly increasing in ``[0, numel)`` and ``out`` holds
    ``ceil((n + ((numel - 1) >> low_bits)) / 8)`` bytes."""
    for i in range(indices.shape[0]):
        p = (indices[i] >> low_bits) + i
        out[p >> 3] |= np.uint8(1 << (p & 7))


@njit(cache=True, nogil=True)
def ef_decode(high, nbits_high, lows, low_bits, numel, out):  # pragma: no cover - numba
    """Rebuild Elias-Fano positions from the high bit array and the low parts.

    Returns ``(status, i, detail)``: ``(STATUS_OK, n, 0)``, or the failing position
    ``i`` with the offending value (or bit position for ``STATUS_EXTRA_BITS``).

    Contract: ``lows`` and ``out`` have the same length ``n``; ``high`` holds
    ``ceil(nbits_high / 8)`` bytes; ``low_bits <= 56``; ``numel < 2**56``. The high
    part of a position is range-checked before it is shifted, so nothing overflows.
    """
    n = out.shape[0]
    max_high = (numel - 1) >> low_bits
    found = 0
    prev = -1
    for j in range(high.shape[0]):
        b = np.int64(high[j])
        while b != 0:
            p = j * 8 + _CTZ8[b]
            b &= b - 1
            if found >= n or p >= nbits_high:
                return STATUS_EXTRA_BITS, found, p
            h = p - found
            if h > max_high:
                # Report the least position this high part implies (no overflow:
                # it is below numel + 2**low_bits <= 2**57).
                return STATUS_OUT_OF_RANGE, found, (max_high + 1) << low_bits
            x = (h << low_bits) | np.int64(lows[found])
            if x >= numel:
                return STATUS_OUT_OF_RANGE, found, x
            if x <= prev:
                return STATUS_UNORDERED, found, x
            out[found] = x
            prev = x
            found += 1
    if found < n:
        return STATUS_TRUNCATED, found, found
    return STATUS_OK, n, 0
