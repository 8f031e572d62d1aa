"""Sign with scale (EF-signSGD, Karimireddy et al., 2019): 1 bit per value.

All kept values of a tensor travel as their signs and one float, the mean magnitude
``||v||_1 / n``; a value comes back as ``+-scale``. Biased by design, which is why it
is meant to run under error feedback (``sign+ef``). Zero counts as positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedsync.compression.base import Quantizer
from fedsync.compression.config import BuildContext, QuantizerConfig
from fedsync.compression.registry import register
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import QuantizedValues, device_tensor

__all__ = ["Sign", "SignConfig"]


@register()
@dataclass(frozen=True)
class SignConfig(QuantizerConfig):
    """``sign``: 1 bit per value plus one scale per tensor."""

    name: ClassVar[str] = "sign"

    def build(self, context: BuildContext) -> Sign:
        return Sign(self)


class Sign(Quantizer):
    """Signs times the mean magnitude."""

    scheme = "sign"

    @property
    def bits(self) -> int:
        return 1

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        # The magnitudes are summed in a fixed order: the same scale on every device.
        codes, scale = backend_for(values).sign_quantize(values.detach())
        return QuantizedValues(
            self.scheme, 1, codes, {"scale": np.array([scale], dtype=np.float32)}
        )

    def param_lengths(self, count: int) -> dict[str, int]:
        return {"scale": 1}

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        scale = float(np.float32(q.params["scale"][0]))
        codes = device_tensor(q.codes, device, torch.float32)
        return (1.0 - 2.0 * codes) * scale

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        scale = float(q.params["scale"][0])
        return (values.abs() + scale) * (1 + 2.0**-22)
