"""Rotations: orthonormal maps of the kept values between sparsifier and quantizer.

Every module of this folder is imported here: a new rotation is its file alone.
"""

from fedsync.compression.rotations.hadamard import (
    RandomizedHadamard,
    RHTConfig,
    fwht,
    rademacher_signs,
)
from fedsync.plugins import import_submodules

import_submodules(__name__, __path__)

__all__ = ["RHTConfig", "RandomizedHadamard", "fwht", "rademacher_signs"]
