"""Seeds for the stochastic parts, derived per tensor and stable across processes.

Python's ``hash`` of a string changes from process to process (``PYTHONHASHSEED``), so
it never feeds a seed here. A BLAKE2b digest of the parts does: the same
``(seed, tensor name, purpose)`` gives the same stream on every machine, and each
tensor and each stage (sparsify, quantize, mask) draws from its own stream, so
changing the quantizer never moves the positions random-k picks.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["derive_seed", "rng_for"]


def derive_seed(seed: int, *parts: str | int) -> int:
    """A 63-bit seed from ``seed`` and any number of labels.

    Parameters
    ----------
    seed : int
        The base seed (any Python int; negative values are allowed).
    *parts : str or int
        Labels that make the stream distinct: a tensor name, a stage, a step.

    Returns
    -------
    int
        Non-negative, below ``2**63``.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(str(int(seed)).encode())
    for part in parts:
        # A separator byte that cannot occur in the text keeps ("ab", "c") != ("a", "bc").
        h.update(b"\x00" + str(part).encode("utf-8"))
    return int.from_bytes(h.digest(), "little") >> 1


def rng_for(seed: int, *parts: str | int) -> np.random.Generator:
    """A numpy Generator (PCG64) seeded with :func:`derive_seed` of the arguments."""
    return np.random.default_rng(derive_seed(seed, *parts))
