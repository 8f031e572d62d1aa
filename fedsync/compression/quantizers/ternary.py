"""Ternary (TernGrad, Wen et al., 2017): {-1, 0, +1} times ``max |v|``, unbiased.

A value ``v`` becomes ``sign(v) * b`` with ``b ~ Bernoulli(|v| / max|v|)`` and comes back
as ``sign(v) * b * max|v|``, so ``E = v``; the error is at most ``max |v|``. Codes: 0 for
zero, 1 for ``+1``, 2 for ``-1`` (3 is invalid), 2 bits each; ``max |v|`` travels as the
param ``"scale"``. TernGrad's optional gradient clipping is left to the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Quantizer
from fedsync.compression.config import BuildContext, QuantizerConfig
from fedsync.compression.registry import register
from fedsync.compression.seeding import derive_seed
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import QuantizedValues, device_tensor

__all__ = ["Ternary", "TernaryConfig"]


@register()
@dataclass(frozen=True)
class TernaryConfig(QuantizerConfig):
    """``ternary``: 2 bits per value plus one scale per tensor."""

    name: ClassVar[str] = "ternary"

    def build(self, context: BuildContext) -> Ternary:
        return Ternary(self)


class Ternary(Quantizer):
    """Stochastic {-1, 0, +1} * max|v|."""

    scheme = "ternary"
    unbiased = True

    @property
    def bits(self) -> int:
        return 2

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        # Philox uniforms (fedsync.kernels.philox): the same codes on every device.
        codes, scale = backend_for(values).ternary_quantize(
            values.detach(), derive_seed(seed, "ternary")
        )
        return QuantizedValues(
            self.scheme, 2, codes, {"scale": np.array([scale], dtype=np.float32)}
        )

    def param_lengths(self, count: int) -> dict[str, int]:
        return {"scale": 1}

    def check_codes(self, codes: np.ndarray) -> str | None:
        if codes.size and int(codes.max()) > 2:
            return "code 3 is not a ternary value (0, +1, -1 are 0, 1, 2)"
        return None

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        scale = float(np.float32(q.params["scale"][0]))
        table = torch.tensor([0.0, scale, -scale], dtype=torch.float32, device=device)
        codes = device_tensor(q.codes, device, torch.int64)
        return table[codes]

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        scale = float(q.params["scale"][0])
        return torch.full_like(values, scale * (1 + 2.0**-22))
