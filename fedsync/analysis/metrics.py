"""Measures of the supports of sparse updates (which positions each one keeps).

A *support* is a sorted array of unique flat positions in ``[0, numel)`` (int64), the
positions one update of one tensor carries. These functions are pure numpy, take
supports as the decoder hands them to the server, and have closed-form answers on
hand-made supports (``tests/unit/test_analysis_metrics.py``):

* :func:`density` and :func:`union_growth` -- what one update keeps, and what the
  server's buffer holds once ``K = 1, 2, ...`` of them are summed;
* :func:`pairwise_jaccard` and :func:`overlap_shares` -- how much the clients' kept
  positions coincide;
* :func:`partition_imbalance` -- Zen's measure for partitioned aggregation: with the
  index range cut into ``P`` equal parts (one per aggregator), the busiest part's
  non-zeros over the mean part's (1.0: perfectly even, ``P``: all in one part);
* :func:`entropy_bits_per_nnz` -- ``H(rho) / rho``, the bits per kept position that
  any coding of a *random* support of density ``rho`` needs on average.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np

__all__ = [
    "check_support",
    "density",
    "entropy_bits_per_nnz",
    "keep_counts",
    "overlap_shares",
    "pairwise_jaccard",
    "partition_imbalance",
    "union_growth",
]


def check_support(support: np.ndarray, numel: int) -> np.ndarray:
    """``support`` as int64 after checking it is sorted, unique and in ``[0, numel)``.

    Raises
    ------
    ValueError
        Naming what is wrong.
    """
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    arr = np.asarray(support)
    if arr.ndim != 1:
        raise ValueError(f"a support must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"a support holds integer positions, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size:
        if arr[0] < 0 or arr[-1] >= numel:
            raise ValueError(f"support positions must lie in [0, {numel})")
        if np.any(np.diff(arr) <= 0):
            raise ValueError("support positions must be strictly increasing")
    return arr


def density(support: np.ndarray, numel: int) -> float:
    """Kept positions over ``numel``."""
    return check_support(support, numel).size / numel


def union_growth(supports: Sequence[np.ndarray], numel: int) -> list[float]:
    """Density of the union of the first ``K`` supports, for ``K = 1 .. len(supports)``.

    What a server buffer summing those ``K`` updates holds: non-decreasing, from the
    first update's density up to at most ``min(1, sum of densities)``.
    """
    seen = np.zeros(numel, dtype=bool)
    out = []
    held = 0
    for support in supports:
        arr = check_support(support, numel)
        held += int(np.count_nonzero(~seen[arr]))
        seen[arr] = True
        out.append(held / numel)
    return out


def pairwise_jaccard(supports: Sequence[np.ndarray], numel: int) -> list[float]:
    """``|A & B| / |A | B|`` for every pair of supports (``i < j``, in that order).

    Two empty supports count as identical (1.0).
    """
    arrays = [check_support(s, numel) for s in supports]
    out = []
    for a, b in combinations(arrays, 2):
        both = np.intersect1d(a, b, assume_unique=True).size
        either = a.size + b.size - both
        out.append(both / either if either else 1.0)
    return out


def keep_counts(supports: Sequence[np.ndarray], numel: int) -> np.ndarray:
    """For every position, how many of the supports keep it (``int64``, length ``numel``)."""
    counts = np.zeros(numel, dtype=np.int64)
    for support in supports:
        counts[check_support(support, numel)] += 1
    return counts


def overlap_shares(supports: Sequence[np.ndarray], numel: int) -> dict[str, float]:
    """How the union of ``n`` supports is shared among them.

    Returns
    -------
    dict
        ``union_density`` (positions kept by any, over ``numel``), and, as shares of
        the union, ``kept_by_2`` (kept by at least two supports), ``kept_by_half``
        (by at least ``ceil(n / 2)``, at least two) and ``kept_by_all`` (by all ``n``).
        Shares are 0.0 when the union is empty.
    """
    n = len(supports)
    if n == 0:
        raise ValueError("overlap needs at least one support")
    counts = keep_counts(supports, numel)
    union = int(np.count_nonzero(counts))
    half = max(2, math.ceil(n / 2))

    def share(least: int) -> float:
        return int(np.count_nonzero(counts >= least)) / union if union else 0.0

    return {
        "union_density": union / numel,
        "kept_by_2": share(2),
        "kept_by_half": share(half),
        "kept_by_all": share(n),
    }


def partition_imbalance(support: np.ndarray, numel: int, parts: int) -> float:
    """Zen's imbalance: the busiest of ``parts`` equal index ranges over the mean.

    The range ``[0, numel)`` is cut at ``floor(i * numel / parts)``; the result is
    ``max(load) / (nnz / parts)``, between 1.0 (even) and ``parts`` (all in one
    range). An empty support is even (1.0).

    Raises
    ------
    ValueError
        If ``parts`` is not in ``[1, numel]``.
    """
    arr = check_support(support, numel)
    if not 1 <= parts <= numel:
        raise ValueError(f"parts must be in [1, {numel}], got {parts}")
    if arr.size == 0:
        return 1.0
    bounds = (np.arange(parts + 1, dtype=np.int64) * numel) // parts
    loads = np.diff(np.searchsorted(arr, bounds, side="left"))
    return float(loads.max()) * parts / arr.size


def entropy_bits_per_nnz(nnz: int, numel: int) -> float:
    """``H(rho) / rho`` with ``rho = nnz / numel``: bits per kept position of an ideal
    coding of a random support (0.0 for an empty or full one)."""
    if not 0 <= nnz <= numel:
        raise ValueError(f"nnz must be in [0, numel={numel}], got {nnz}")
    if nnz == 0 or nnz == numel:
        return 0.0
    rho = nnz / numel
    h = -rho * math.log2(rho) - (1.0 - rho) * math.log2(1.0 - rho)
    return h / rho
