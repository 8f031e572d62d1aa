"""Uniform b-bit quantization with a min and a scale per chunk of kept values.

Each chunk of ``chunk`` consecutive kept values gets ``min`` and
``scale = (max - min) / (2**bits - 1)``; a value travels as
``rint((v - min) / scale)`` and comes back as ``code * scale + min``. Deterministic
round-to-nearest: the error is at most half a step, ``scale / 2``, plus float32
rounding (:meth:`Uniform.error_bound` states it exactly). The CPU work is one fused
numba pass (:mod:`fedsync.kernels.quantize`); other devices use the torch backend, which
computes the same codes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Quantizer
from fedsync.compression.config import MAX_STAGE_INT, BuildContext, QuantizerConfig, check_range
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import register
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import QuantizedValues, device_tensor

__all__ = ["Uniform", "UniformConfig"]


@register()
@dataclass(frozen=True)
class UniformConfig(QuantizerConfig):
    """``uniform:<bits>[,chunk=<n>]``.

    Parameters
    ----------
    bits : int
        Bits per code, 1 to 8.
    chunk : int
        Kept values per (min, scale) pair; smaller chunks track the values' range
        more closely at 64 bits of params per chunk.
    """

    name: ClassVar[str] = "uniform"
    primary: ClassVar[str | None] = "bits"
    bits: int = 8
    chunk: int = 1024

    def __post_init__(self) -> None:
        check_range("uniform", "bits", self.bits, 1, 8)
        if not isinstance(self.bits, int):
            raise SpecError(f"uniform: bits must be an int, got {self.bits!r}")
        if not isinstance(self.chunk, int) or not 1 <= self.chunk <= MAX_STAGE_INT:
            raise SpecError(f"uniform: chunk must be an int >= 1 (below 2**63), got {self.chunk!r}")

    def with_bits(self, bits: int) -> UniformConfig:
        return dataclasses.replace(self, bits=bits)

    def build(self, context: BuildContext) -> Uniform:
        return Uniform(self)


class Uniform(Quantizer):
    """Per-chunk min/scale uniform quantizer (see module docstring)."""

    scheme = "uniform"
    config: UniformConfig

    @property
    def bits(self) -> int:
        return self.config.bits

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        codes, mins, scales = backend_for(values).uniform_quantize(
            values.detach(), self.config.bits, self.config.chunk
        )
        return QuantizedValues(self.scheme, self.bits, codes, {"min": mins, "scale": scales})

    def param_lengths(self, count: int) -> dict[str, int]:
        chunks = -(-count // self.config.chunk)
        return {"min": chunks, "scale": chunks}

    def check_codes(self, codes: np.ndarray) -> str | None:
        return None  # every b-bit code is a valid level

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        # Codes still on the sender's device are decoded there: what error feedback
        # subtracts never crosses to the host.
        return backend_for(device).uniform_dequantize(
            q.codes, q.params["min"], q.params["scale"], self.config.chunk, device
        )

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        n = values.numel()
        owner = torch.arange(n, device=values.device) // self.config.chunk
        lo = device_tensor(q.params["min"], values.device)[owner].double()
        scale = device_tensor(q.params["scale"], values.device)[owner].double()
        hi = lo + scale * ((1 << self.bits) - 1)
        # Half a step, plus a few float32 roundings of numbers as large as the chunk's
        # extremes (subtract, divide, multiply, add), plus the smallest subnormal steps.
        bound = 0.5 * scale + 2.0**-20 * (lo.abs() + hi.abs()) + 1e-42
        return bound.float()
