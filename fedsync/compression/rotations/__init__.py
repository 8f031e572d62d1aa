"""Rotations: orthonormal maps of the kept values between sparsifier and quantizer."""

from fedsync.compression.rotations.hadamard import (
    RandomizedHadamard,
    RHTConfig,
    fwht,
    rademacher_signs,
)

__all__ = ["RHTConfig", "RandomizedHadamard", "fwht", "rademacher_signs"]
