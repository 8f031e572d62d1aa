"""Uniform random subsets of ``range(n)`` in memory proportional to the subset.

``numpy.random.Generator.choice(n, k, replace=False)`` allocates ``arange(n)`` (8 bytes
per element) as soon as ``k`` exceeds ``n / 20``; a decoder that derives a shared
mask from a frame's declared shape would then spend memory in proportion to a size
the sender chose, not to the values it sent. :func:`sorted_sample` draws the same
distribution (every ``k``-subset equally likely) with Floyd's algorithm instead:
``m = min(k, n - k)`` draws, one open-addressing hash set of at most ``8m / 3``
int64 slots, then a sort; when ``k > n / 2`` it draws the ``n - k`` left-out
positions and lists the others. Peak memory is at most 32 bytes per kept position
whatever ``n`` is, and time is ``O(k log k)`` plus ``O(n)`` only when ``n < 2k``.

The random draws come from the caller's numpy ``Generator`` in blocks (one bounded
integer per step, ``rng.integers(0, j + 1)``), so a seed fixes the subset on every
machine that runs the same numpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["sorted_sample"]

_BLOCK = 1 << 16
"""Draws generated per call into the kernel (bounds the transient draw array)."""
_EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _floyd_block(draws, first_j, table, shift, chosen, filled):
    """Floyd steps ``j = first_j, first_j + 1, ...``: insert ``draws[i]`` (uniform in
    ``[0, j]``) unless already chosen, else ``j`` itself. Returns the new fill count.

    ``table`` is a power-of-two open-addressing set of int64 (``-1`` empty) with room
    for every insertion (load at most 3/4); ``chosen`` receives each inserted value.
    """
    mask = table.shape[0] - 1
    for i in range(draws.shape[0]):
        j = first_j + i
        value = draws[i]
        slot = np.int64((np.uint64(value) * _GOLDEN) >> np.uint64(shift)) & mask
        while table[slot] != -1 and table[slot] != value:
            slot = (slot + 1) & mask
        if table[slot] == value:
            # Taken already: Floyd inserts j instead, which no earlier step could hold.
            value = j
            slot = np.int64((np.uint64(value) * _GOLDEN) >> np.uint64(shift)) & mask
            while table[slot] != -1:
                slot = (slot + 1) & mask
        table[slot] = value
        chosen[filled] = value
        filled += 1
    return filled


@njit(cache=True, nogil=True)
def _complement(left_out, n, out):
    """Write ``range(n)`` minus the sorted ``left_out`` into ``out`` (in order)."""
    cursor = 0
    skip = 0
    for i in range(n):
        if skip < left_out.shape[0] and left_out[skip] == i:
            skip += 1
        else:
            out[cursor] = i
            cursor += 1


def sorted_sample(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """``k`` distinct positions of ``range(n)``, uniformly at random, sorted (int64).

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of randomness (its stream advances).
    n : int
        Population size, ``0 <= n < 2**62``.
    k : int
        Subset size, ``0 <= k <= n``.

    Raises
    ------
    ValueError
        If ``k`` or ``n`` is out of range.
    """
    if not 0 <= k <= n < 1 << 62:
        raise ValueError(f"need 0 <= k <= n < 2**62, got k={k}, n={n}")
    m = min(k, n - k)
    chosen = np.empty(m, dtype=np.int64)
    if m:
        size = 1 << max(1, (4 * m - 1) // 3).bit_length()
        table = np.full(size, _EMPTY, dtype=np.int64)
        shift = 64 - (size.bit_length() - 1)
        filled = 0
        for start in range(0, m, _BLOCK):
            stop = min(start + _BLOCK, m)
            first_j = n - m + start
            highs = np.arange(first_j + 1, n - m + stop + 1, dtype=np.int64)
            draws = rng.integers(0, highs, dtype=np.int64)
            filled = _floyd_block(draws, first_j, table, shift, chosen, filled)
        del table
        chosen.sort()
    if m == k:
        return chosen
    out = np.empty(k, dtype=np.int64)
    _complement(chosen, n, out)
    return out
