"""QSGD (Alistarh et al., 2017): stochastic rounding to ``s`` levels of the norm.

Per chunk (QSGD's "bucket") of kept values with L2 norm ``||v||``, a value becomes a
level ``l`` in ``0..s`` with ``E[l] = s |v| / ||v||`` (round down or up at random, the
probability of rounding up being the fractional part) and its sign; it comes back as
``sign * l * ||v|| / s``. Unbiased, and within ``||v|| / s`` of the input.

Code layout: ``code = 2 * l + (v < 0)``; ``bits = 1 + bit_length(s)``. The norms travel
as the float32 param ``"norm"``, one per chunk. The uniforms come from Philox, a
counter-based generator (value ``i`` draws from ``(seed, i)``, as ``tl.randint`` does
on a GPU; :mod:`fedsync.kernels.philox`), and each norm is summed in index order, so
a CPU and a GPU run of the same spec and seed give the same codes
(:mod:`fedsync.kernels.quantize` states the arithmetic).
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
from fedsync.compression.seeding import derive_seed
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import QuantizedValues, device_tensor

__all__ = ["QSGD", "QSGDConfig"]

_MAX_LEVELS = (1 << 15) - 1  # 16-bit codes at most


@register()
@dataclass(frozen=True)
class QSGDConfig(QuantizerConfig):
    """``qsgd:<levels>[,chunk=<n>]``.

    Parameters
    ----------
    levels : int
        ``s``, the number of non-zero levels, 1 to 32767.
    chunk : int
        Kept values per norm (QSGD's bucket size); smaller buckets lower the variance.
    """

    name: ClassVar[str] = "qsgd"
    primary: ClassVar[str | None] = "levels"
    levels: int = 16
    chunk: int = 512

    def __post_init__(self) -> None:
        if not isinstance(self.levels, int):
            raise SpecError(f"qsgd: levels must be an int, got {self.levels!r}")
        check_range("qsgd", "levels", self.levels, 1, _MAX_LEVELS)
        if not isinstance(self.chunk, int) or not 1 <= self.chunk <= MAX_STAGE_INT:
            raise SpecError(f"qsgd: chunk must be an int >= 1 (below 2**63), got {self.chunk!r}")

    def with_bits(self, bits: int) -> QSGDConfig:
        """``s = 2**(bits - 1) - 1`` levels: one bit is the sign."""
        if not isinstance(bits, int) or not 2 <= bits <= 16:
            raise SpecError(f"qsgd: bits must be an int in 2..16 (one is the sign), got {bits!r}")
        return dataclasses.replace(self, levels=(1 << (bits - 1)) - 1)

    def build(self, context: BuildContext) -> QSGD:
        return QSGD(self)


class QSGD(Quantizer):
    """Unbiased stochastic quantizer to ``s`` levels of each chunk's norm."""

    scheme = "qsgd"
    unbiased = True
    config: QSGDConfig

    @property
    def bits(self) -> int:
        return 1 + self.config.levels.bit_length()

    def _owner(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.arange(n, device=device) // self.config.chunk

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        # Philox uniforms and fixed-order norms: the same codes on every device.
        codes, norms = backend_for(values).qsgd_quantize(
            values.detach(), self.config.levels, self.config.chunk, derive_seed(seed, "qsgd")
        )
        if isinstance(codes, np.ndarray):
            codes = codes.astype(np.uint8 if self.bits <= 8 else np.uint16)
        # else: a device kernel's uint8 or int16 codes, left where they are
        return QuantizedValues(self.scheme, self.bits, codes, {"norm": norms})

    def param_lengths(self, count: int) -> dict[str, int]:
        return {"norm": -(-count // self.config.chunk)}

    def check_codes(self, codes: np.ndarray) -> str | None:
        if codes.size and int(codes.max()) >> 1 > self.config.levels:
            return f"a level above s={self.config.levels}"
        return None

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        if isinstance(q.codes, torch.Tensor):
            codes = q.codes.to(device, torch.int32) & 0xFFFF  # int16 storage read unsigned
        else:
            codes = torch.from_numpy(np.asarray(q.codes).astype(np.int32)).to(device)
        norms = device_tensor(q.params["norm"], device, torch.float32)
        step = (norms / self.config.levels)[self._owner(codes.numel(), device)]
        sign = 1.0 - 2.0 * (codes & 1).to(torch.float32)
        return (codes >> 1).to(torch.float32) * step * sign

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        norms = device_tensor(q.params["norm"], values.device)
        norm = norms[self._owner(values.numel(), values.device)]
        # One level step, plus float32 rounding of the few ops involved.
        return norm / self.config.levels * (1 + 2.0**-18) + 1e-38
