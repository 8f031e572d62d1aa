"""``binmean``: b-bit codes over ``range`` standard deviations, each decoded to the mean
of the values in its bin (SparseLoCo's 2-bit values, the statistical quantizer of
INTELLECT-1's and DeMo's reference code).

For the ``n`` kept values of a tensor: ``mean`` and the unbiased standard deviation
``std``; with ``L = 2**bits`` levels the step is ``range * std / L`` and a value's code
is ``clip(rint((v - mean) / step + L / 2), 0, L - 1)`` (the outer bins take everything
beyond them). What travels per tensor is the codes and a table of ``L`` floats: the
mean of the values that fell in each bin (0 for an empty bin). A value comes back as
its bin's mean, so the decoded values keep the sum of the originals per bin; the
error of a value is at most the spread of its bin's values.

The statistics are computed on the host in float64 (one copy of the kept values, a
few percent of the tensor under a sparsifier): the table, and so the frame, has the
same bytes whichever device the values came from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Quantizer
from fedsync.compression.config import BuildContext, QuantizerConfig, check_range
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import register
from fedsync.updates import QuantizedValues, device_tensor, host_array

__all__ = ["BinMean", "BinMeanConfig"]


@register()
@dataclass(frozen=True)
class BinMeanConfig(QuantizerConfig):
    """``binmean:<bits>[,range=<sigmas>]``.

    Parameters
    ----------
    bits : int
        Bits per code, 1 to 8.
    range : float
        Width of the coded range in standard deviations around the mean (> 0); the
        reference implementations use 6.
    """

    name: ClassVar[str] = "binmean"
    primary: ClassVar[str | None] = "bits"
    bits: int = 2
    range: float = 6.0

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool):
            raise SpecError(f"binmean: bits must be an int, got {self.bits!r}")
        check_range("binmean", "bits", self.bits, 1, 8)
        if not (math.isfinite(self.range) and 0.0 < self.range <= 1e6):
            raise SpecError(f"binmean: range must be in (0, 1e6] sigmas, got {self.range!r}")

    def with_bits(self, bits: int) -> BinMeanConfig:
        return dataclasses.replace(self, bits=bits)

    def build(self, context: BuildContext) -> BinMean:
        return BinMean(self)


class BinMean(Quantizer):
    """Codes over ``range`` sigmas, decoded to bin means (see the module docstring)."""

    scheme = "binmean"
    config: BinMeanConfig

    @property
    def bits(self) -> int:
        return self.config.bits

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        host = values.detach().to("cpu", torch.float64).numpy()
        levels = 1 << self.bits
        codes = self._codes(host, levels)
        counts = np.bincount(codes, minlength=levels)
        sums = np.bincount(codes, weights=host, minlength=levels)
        table = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0).astype(np.float32)
        return QuantizedValues(self.scheme, self.bits, codes.astype(np.uint8), {"table": table})

    def _codes(self, host: np.ndarray, levels: int) -> np.ndarray:
        n = host.size
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        mean = float(host.mean())
        centered = host - mean
        std = math.sqrt(float(np.dot(centered, centered)) / (n - 1)) if n > 1 else 0.0
        step = self.config.range * std / levels
        if not (math.isfinite(step) and step > 0.0):
            step = 1.0  # all values equal: one bin holds them all, decoded exactly
        return np.clip(np.rint(centered / step + levels // 2), 0, levels - 1).astype(np.int64)

    def param_lengths(self, count: int) -> dict[str, int]:
        return {"table": 1 << self.bits}

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        table = device_tensor(q.params["table"], device, torch.float32)
        return table[device_tensor(q.codes, device, torch.int64)]

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        # A bin's mean lies between its smallest and largest value: a value is off by
        # at most that spread, plus the float32 rounding of the mean.
        host = values.detach().to("cpu", torch.float64).numpy()
        codes = host_array(q.codes).astype(np.int64)
        levels = 1 << self.bits
        lo = np.full(levels, np.inf)
        hi = np.full(levels, -np.inf)
        np.minimum.at(lo, codes, host)
        np.maximum.at(hi, codes, host)
        extreme = np.maximum(np.abs(lo), np.abs(hi))[codes]
        spread = (hi - lo)[codes] + 2.0**-22 * extreme + 1e-42
        return torch.from_numpy(spread.astype(np.float32)).to(values.device)
