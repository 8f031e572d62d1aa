"""TEASQ-Fed's decaying compression: density and bit width per task, by model version.

Early in training updates are large and informative, so TEASQ-Fed sends them with more
coordinates and more bits; as the model settles it compresses harder. Each task's
uplink codec spec comes from a template with ``{density}`` and ``{bits}`` placeholders,
filled with values that decay with the global model version ``v`` the task starts from:

* ``exponential``: ``floor + (start - floor) * exp(-decay * v)``
* ``linear``: ``max(floor, start - decay * v)``
* ``step``: ``max(floor, start * 0.5 ** floor(decay * v))`` (halve every ``1/decay``
  versions)

Bits are rounded to the nearest integer after the same formula. ``decay = 0`` keeps
the start values (FedBuff and FedAsync use the schedule this way, frozen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_UPLINK_TEMPLATE", "CompressionSchedule", "DecayKind"]

DecayKind = Literal["exponential", "linear", "step"]

DEFAULT_UPLINK_TEMPLATE = "topk:{density}+uniform:{bits}+ef"
"""Top-k sparsification, b-bit uniform quantization, client-side error feedback."""


@dataclass(frozen=True)
class CompressionSchedule:
    """Per-task uplink codec spec following a decaying density and bit width.

    Parameters
    ----------
    template : str
        The codec spec with ``{density}`` and/or ``{bits}`` placeholders (a spec
        without them is used as is for every task).
    density_start, density_floor : float
        Fraction of coordinates kept at version 0 and at the end; ``0 < floor <=
        start <= 1``.
    density_decay : float
        Decay rate per model version, ``>= 0``.
    bits_start, bits_floor : int
        Bits per value at version 0 and at the end; ``1 <= floor <= start <= 32``.
    bits_decay : float
        Decay rate per model version, ``>= 0``.
    kind : {"exponential", "linear", "step"}
        The decay curve (see the module docstring).
    frozen : bool
        Ignore the decay rates (policies without decaying compression).
    """

    template: str = DEFAULT_UPLINK_TEMPLATE
    density_start: float = 0.1
    density_floor: float = 0.01
    density_decay: float = 0.0
    bits_start: int = 8
    bits_floor: int = 4
    bits_decay: float = 0.0
    kind: DecayKind = "exponential"
    frozen: bool = False

    def __post_init__(self) -> None:
        if not self.template.strip():
            raise ValueError("uplink codec template must not be empty")
        if not (0.0 < self.density_floor <= self.density_start <= 1.0):
            raise ValueError(
                "density must satisfy 0 < density-floor <= density-start <= 1, got "
                f"floor={self.density_floor}, start={self.density_start}"
            )
        if not (1 <= self.bits_floor <= self.bits_start <= 32):
            raise ValueError(
                "bits must satisfy 1 <= bits-floor <= bits-start <= 32, got "
                f"floor={self.bits_floor}, start={self.bits_start}"
            )
        for name, rate in (("density-decay", self.density_decay), ("bits-decay", self.bits_decay)):
            if not (math.isfinite(rate) and rate >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, got {rate}")
        if self.kind not in ("exponential", "linear", "step"):
            raise ValueError(
                f"decay kind must be 'exponential', 'linear' or 'step', got {self.kind!r}"
            )

    def density(self, version: int) -> float:
        """Fraction of coordinates a task starting from ``version`` keeps."""
        return self._decay(self.density_start, self.density_floor, self.density_decay, version)

    def bits(self, version: int) -> int:
        """Bits per value for a task starting from ``version``."""
        value = self._decay(self.bits_start, self.bits_floor, self.bits_decay, version)
        return min(self.bits_start, max(self.bits_floor, round(value)))

    def spec(self, version: int) -> str:
        """The uplink codec spec for a task starting from ``version``."""
        return self.template.replace("{density}", _fmt(self.density(version))).replace(
            "{bits}", str(self.bits(version))
        )

    def extreme_specs(self) -> tuple[str, str]:
        """The specs at version 0 and in the limit, to check both parse at start-up."""
        start = self.template.replace("{density}", _fmt(self.density_start)).replace(
            "{bits}", str(self.bits_start)
        )
        floor = self.template.replace("{density}", _fmt(self.density_floor)).replace(
            "{bits}", str(self.bits_floor)
        )
        return start, floor

    def _decay(self, start: float, floor: float, rate: float, version: int) -> float:
        if version < 0:
            raise ValueError(f"model version must be >= 0, got {version}")
        if self.frozen or rate == 0.0:
            return float(start)
        if self.kind == "exponential":
            return floor + (start - floor) * math.exp(-rate * version)
        if self.kind == "linear":
            return max(floor, start - rate * version)
        return max(floor, start * 0.5 ** math.floor(rate * version))


def _fmt(density: float) -> str:
    # Six significant digits: stable text for the same value (determinism of specs and
    # logs), precise enough that the codec keeps the intended number of coordinates.
    return f"{density:.6g}"
