"""Float quantizers: the raw bit patterns of fp32, fp16 or bf16 values.

``fp32`` (alias ``none``) sends kept values exactly. ``fp16`` and ``bf16`` round to
nearest-even; values beyond the format's largest finite number saturate to it rather
than overflowing to Inf (error feedback then carries the excess).

On the host (the numba backend) the codes are numpy arrays; on any other backend
they stay on the values' device as the bit patterns in a signed tensor of the same
width (``int32``, ``int16``), which the frame writer reads as unsigned.
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
from fedsync.updates import QuantizedValues

__all__ = ["BF16", "FP16", "FP32", "Bf16Config", "Fp16Config", "Fp32Config"]

_FP16_MAX = 65504.0
_BF16_MAX = float(torch.finfo(torch.bfloat16).max)


@register("none")
@dataclass(frozen=True)
class Fp32Config(QuantizerConfig):
    """Raw float32 bits (32 per value): exact."""

    name: ClassVar[str] = "fp32"

    def build(self, context: BuildContext) -> FP32:
        return FP32(self)


@register()
@dataclass(frozen=True)
class Fp16Config(QuantizerConfig):
    """IEEE half precision (16 bits per value)."""

    name: ClassVar[str] = "fp16"

    def build(self, context: BuildContext) -> FP16:
        return FP16(self)


@register()
@dataclass(frozen=True)
class Bf16Config(QuantizerConfig):
    """bfloat16 (16 bits per value): float32's range, 8 significant bits."""

    name: ClassVar[str] = "bf16"

    def build(self, context: BuildContext) -> BF16:
        return BF16(self)


class FP32(Quantizer):
    """Kept values travel as their float32 bit patterns."""

    scheme = "fp32"

    @property
    def bits(self) -> int:
        return 32

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        # A copy, never a view: the values may be the caller's (or the EF residual's)
        # memory, which changes after this call.
        if not backend_for(values).host:
            return QuantizedValues(self.scheme, 32, values.detach().clone().view(torch.int32))
        host = values.detach().to("cpu", torch.float32).numpy().copy()
        return QuantizedValues(self.scheme, 32, host.view(np.uint32))

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        if isinstance(q.codes, torch.Tensor):
            return q.codes.to(device, torch.int32).view(torch.float32)
        codes = np.ascontiguousarray(q.codes, dtype=np.uint32)
        return torch.from_numpy(codes.view(np.float32).copy()).to(device)

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        return torch.zeros_like(values)


class _Float16Like(Quantizer):
    dtype: ClassVar[torch.dtype]
    limit: ClassVar[float]
    rel: ClassVar[float]  # half an ulp, relative
    tiny: ClassVar[float]  # half the smallest subnormal step

    @property
    def bits(self) -> int:
        return 16

    def quantize(self, values: torch.Tensor, seed: int) -> QuantizedValues:
        half = values.detach().clamp(-self.limit, self.limit).to(self.dtype)
        if not backend_for(values).host:
            return QuantizedValues(self.scheme, 16, half.view(torch.int16))
        codes = half.view(torch.int16).cpu().numpy().view(np.uint16).copy()
        return QuantizedValues(self.scheme, 16, codes)

    def decode(self, q: QuantizedValues, device: torch.device) -> torch.Tensor:
        if isinstance(q.codes, torch.Tensor):
            bits = q.codes.to(device, torch.int16)
            return bits.view(self.dtype).to(torch.float32)
        codes = np.ascontiguousarray(q.codes, dtype=np.uint16).view(np.int16)
        return torch.from_numpy(codes.copy()).view(self.dtype).to(device, torch.float32)

    def error_bound(self, values: torch.Tensor, q: QuantizedValues) -> torch.Tensor:
        mag = values.abs()
        return mag.clamp(max=self.limit) * self.rel + self.tiny + (mag - self.limit).clamp(min=0)


class FP16(_Float16Like):
    """Kept values as IEEE half precision, saturating at +-65504."""

    scheme = "fp16"
    dtype = torch.float16
    limit = _FP16_MAX
    rel = 2.0**-11
    tiny = 2.0**-25


class BF16(_Float16Like):
    """Kept values as bfloat16, saturating at its largest finite value."""

    scheme = "bf16"
    dtype = torch.bfloat16
    limit = _BF16_MAX
    rel = 2.0**-8
    tiny = 2.0**-134
