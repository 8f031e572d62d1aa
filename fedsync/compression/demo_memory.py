"""``demo``: DeMo's decoupled momentum as the error-feedback memory.

DeMo (Peng et al., 2024) keeps the momentum on the sender, sends only a compressed
part of it (the DCT top-k, :mod:`fedsync.compression.sparsifiers.dct`) and removes
what it sent from the momentum, so the momentum *is* the error-feedback memory. Per
tensor::

    m    = beta * m + input          (m starts at zero)
    sent = decode(compress(m))       (what every receiver decodes)
    m    = m - sent

With ``beta = 1`` this would be plain error feedback (``ef``); DeMo's decay forgets
mass that waits too long. The memory lives in the codec's
:class:`~fedsync.compression.error_feedback.ErrorFeedbackState` (as its residuals,
on the device of the tensor), so it is exported and restored like ``ef``'s.

Spec: ``dct:8,chunk=64+fp32+demo:0.999`` (``demo:beta=0.999`` is the same). The DeMo
optimizer for ``torch.distributed``, built on this memory, is
:mod:`fedsync.ddp.demo_optimizer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedsync.compression.config import BuildContext, StageConfig, StageKind, check_range
from fedsync.compression.error_feedback import ErrorFeedbackState, MemoryStage, memory_for
from fedsync.compression.pipeline import Compressed, Compressor, subtract_sent
from fedsync.compression.registry import register
from fedsync.updates import TensorSpec

__all__ = ["DeMoConfig", "DeMoFeedback"]


@register()
@dataclass(frozen=True)
class DeMoConfig(StageConfig):
    """``demo[:<beta>]``: decoupled momentum with decay ``beta`` in [0, 1)."""

    name: ClassVar[str] = "demo"
    kind: ClassVar[StageKind] = "feedback"
    primary: ClassVar[str | None] = "beta"
    beta: float = 0.999

    def __post_init__(self) -> None:
        check_range("demo", "beta", self.beta, 0.0, 1.0, hi_open=True)

    def build(self, context: BuildContext) -> DeMoConfig:
        # Like ef, the momentum wraps a compressor; see wrap().
        return self

    def wrap(self, inner: Compressor, state: ErrorFeedbackState | None = None) -> DeMoFeedback:
        """The decoupled momentum around ``inner``, keeping its memory in ``state``."""
        return DeMoFeedback(inner, self, state)


class DeMoFeedback(MemoryStage):
    """Decoupled momentum around ``inner`` (any :class:`Compressor`).

    Parameters
    ----------
    inner : Compressor
        Usually a pipeline with the ``dct`` sparsifier.
    config : DeMoConfig, optional
    state : ErrorFeedbackState, optional
        Where the momentum lives (``state.residuals``); a fresh one by default.
    """

    def __init__(
        self,
        inner: Compressor,
        config: DeMoConfig | None = None,
        state: ErrorFeedbackState | None = None,
    ) -> None:
        self.inner = inner
        self.config = config or DeMoConfig()
        self.state = state if state is not None else ErrorFeedbackState()

    def momentum(self, name: str) -> torch.Tensor | None:
        """The current momentum of tensor ``name`` (flat float32), if any."""
        return self.state.residuals.get(name)

    def compress(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Compressed:
        """Decay the momentum, add ``x``, compress it and remove what was sent."""
        memory = memory_for(self.state.residuals, spec, x)
        memory.mul_(self.config.beta).add_(x)
        compressed = self.inner.compress(spec, memory, seed)
        subtract_sent(memory, compressed, self.inner.sent(compressed))
        return compressed
