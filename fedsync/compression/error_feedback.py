"""Error feedback around any compressor, with optional DGC momentum correction.

What a compressor leaves out is not lost but remembered (Seide et al. 2014; Karimireddy
et al. 2019, EF-SGD). Per tensor::

    corrected = input + residual               (the residual starts at zero)
    sent      = decode(compress(corrected))    (what the receiver will see)
    residual  = corrected - sent

so ``sent + residual_new == input + residual_old`` up to one float32 rounding.

With DGC's momentum correction (Lin et al., 2018) the velocity ``u`` accumulates the
inputs and the residual accumulates the velocity::

    u = momentum * u + input ;  corrected = residual + u

and momentum-factor masking zeroes ``u`` where values were sent, so stale momentum does
not push the same coordinates again.

The memory is an :class:`ErrorFeedbackState`: float32 tensors by name. The codec's
state (:class:`fedsync.codecs.CodecState`) exports it as plain arrays for Flower's
``context.state``, under the keys :mod:`fedsync.codecs` lays out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fedsync.compression.config import BuildContext, StageConfig, StageKind, check_range
from fedsync.compression.errors import SpecError
from fedsync.compression.pipeline import (
    Compressed,
    Compressor,
    compress_update,
    subtract_sent,
)
from fedsync.compression.registry import register
from fedsync.updates import CompressedTensor, TensorSpec

__all__ = ["ErrorFeedback", "ErrorFeedbackConfig", "ErrorFeedbackState", "memory_for"]


@register()
@dataclass(frozen=True)
class ErrorFeedbackConfig(StageConfig):
    """``ef[:momentum=<m>][,masking=true|false]``.

    Parameters
    ----------
    momentum : float
        DGC momentum correction factor in [0, 1); 0 is plain error feedback.
    masking : bool
        Momentum-factor masking (zero the velocity where values were sent); only
        meaningful with ``momentum > 0``.
    """

    name: ClassVar[str] = "ef"
    kind: ClassVar[StageKind] = "feedback"
    momentum: float = 0.0
    masking: bool = True

    def __post_init__(self) -> None:
        check_range("ef", "momentum", self.momentum, 0.0, 1.0, hi_open=True)
        if not isinstance(self.masking, bool):
            raise SpecError(f"ef: masking must be a bool, got {self.masking!r}")

    def build(self, context: BuildContext) -> ErrorFeedbackConfig:
        # Error feedback wraps a compressor; see ErrorFeedback(inner, config, state).
        return self

    def wrap(self, inner: Compressor, state: ErrorFeedbackState | None = None) -> ErrorFeedback:
        """Error feedback around ``inner``, keeping its memory in ``state``.

        Every feedback stage has this method (``demo`` too); the codec calls it.
        """
        return ErrorFeedback(inner, self, state)


@dataclass
class ErrorFeedbackState:
    """The memory of error feedback, by tensor name.

    Attributes
    ----------
    residuals : dict of str to torch.Tensor
        What was not sent yet: flat float32, on the device of the tensor's updates.
    momenta : dict of str to torch.Tensor
        DGC velocity ``u`` (empty without momentum correction).
    """

    # role: unsent mass (corrected input minus what the receiver decoded)
    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    # role: DGC momentum correction's velocity
    momenta: dict[str, torch.Tensor] = field(default_factory=dict)

    def load(self, other: ErrorFeedbackState) -> None:
        """Replace this state's contents with ``other``'s (in place: sharers see it)."""
        self.residuals.clear()
        self.residuals.update(other.residuals)
        self.momenta.clear()
        self.momenta.update(other.momenta)

    def reset(self) -> None:
        """Forget every residual and velocity."""
        self.residuals.clear()
        self.momenta.clear()


def _memory(table: dict[str, torch.Tensor], spec: TensorSpec, x: torch.Tensor) -> torch.Tensor:
    """The stored tensor for ``spec`` on ``x``'s device (zeros the first time)."""
    stored = table.get(spec.name)
    if stored is None:
        stored = torch.zeros_like(x)
    elif stored.numel() != x.numel():
        raise ValueError(
            f"error-feedback memory for {spec.name!r} has {stored.numel()} values but the "
            f"update has {x.numel()}: the model changed; reset the state"
        )
    elif stored.device != x.device:
        stored = stored.to(x.device)
    table[spec.name] = stored
    return stored


memory_for = _memory
"""Public name of the memory lookup, for the other feedback stages (``demo``)."""


class MemoryStage(ABC):
    """A sender memory around ``inner`` (any :class:`Compressor`): subclasses implement
    ``compress``; what the receiver decodes is the inner compressor's."""

    inner: Compressor
    state: ErrorFeedbackState

    @abstractmethod
    def compress(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Compressed:
        """Compress ``x`` through the memory (subclasses say how)."""

    def sent(self, compressed: Compressed) -> torch.Tensor:
        """What the receiver decodes (delegated to the inner compressor)."""
        return self.inner.sent(compressed)

    def compress_update(
        self, update: Mapping[str, torch.Tensor], seed: int = 0
    ) -> list[CompressedTensor]:
        """Compress every tensor of ``update`` through the memory."""
        return compress_update(self, update, seed)


class ErrorFeedback(MemoryStage):
    """Error feedback around ``inner`` (any :class:`Compressor`).

    Parameters
    ----------
    inner : Compressor
        Usually a :class:`~fedsync.compression.pipeline.Pipeline`.
    config : ErrorFeedbackConfig, optional
    state : ErrorFeedbackState, optional
        Shared memory (the codec passes its own so copies made by ``with_density``
        keep one residual); a fresh one by default.
    """

    def __init__(
        self,
        inner: Compressor,
        config: ErrorFeedbackConfig | None = None,
        state: ErrorFeedbackState | None = None,
    ) -> None:
        self.inner = inner
        self.config = config or ErrorFeedbackConfig()
        self.state = state if state is not None else ErrorFeedbackState()

    def compress(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Compressed:
        """Compress ``x`` plus the residual; keep what was not sent."""
        residual = _memory(self.state.residuals, spec, x)
        momentum = self.config.momentum
        if momentum > 0:
            velocity = _memory(self.state.momenta, spec, x)
            velocity.mul_(momentum).add_(x)
            residual.add_(velocity)
        else:
            residual.add_(x)
        compressed = self.inner.compress(spec, residual, seed)
        subtract_sent(residual, compressed, self.inner.sent(compressed))
        if momentum > 0 and self.config.masking:
            velocity = self.state.momenta[spec.name]
            if compressed.positions is None:
                velocity.zero_()
            else:
                velocity.index_fill_(0, compressed.positions, 0.0)
        return compressed
