"""Typed configuration: one frozen dataclass per stage, and the pipeline that holds them.

Every stage config is a frozen dataclass registered under its spec name (see
:mod:`fedsync.compression.registry`); its fields are the spec's keys, its
``__post_init__`` validates them and says why a value is wrong, and ``build`` makes
the component. A :class:`PipelineConfig` is a sparsifier, a quantizer and optional
error feedback; ``PipelineConfig.from_spec(s).to_spec()`` is the canonical form of
``s`` (see :mod:`fedsync.compression.spec` for the grammar).
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from fedsync.compression.errors import SpecError

if TYPE_CHECKING:
    from fedsync.compression.base import Quantizer, Sparsifier
    from fedsync.compression.error_feedback import ErrorFeedbackConfig

__all__ = [
    "MAX_STAGE_INT",
    "BuildContext",
    "PipelineConfig",
    "QuantizerConfig",
    "SparsifierConfig",
    "StageConfig",
    "StageKind",
    "check_density",
    "check_range",
]

MAX_STAGE_INT = (1 << 63) - 1
"""Largest magnitude of an integer stage field: the kernels take them as int64, so
the spec parser and the configs reject anything wider before it reaches one."""

StageKind = Literal["sparsifier", "quantizer", "feedback"]
"""The three slots of a pipeline, in the order a spec lists them."""

STAGE_ORDER: tuple[StageKind, ...] = ("sparsifier", "quantizer", "feedback")


def check_range(
    stage: str,
    key: str,
    value: float,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    """Raise :class:`SpecError` unless ``lo <(=) value <(=) hi`` (and finite).

    Ints are compared exactly (never converted to float), so an absurdly large one
    is out of range rather than an :class:`OverflowError`.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        shown = repr(value)
        if len(shown) > 40:
            shown = f"{shown[:20]}...({len(shown)} characters)"
        raise SpecError(f"{stage}: {key} must be in {left}{lo:g}, {hi:g}{right}, got {shown}")


def check_density(stage: str, density: float) -> None:
    """A density is the kept fraction: in (0, 1]."""
    check_range(stage, "density", density, 0.0, 1.0, lo_open=True)


@dataclass(frozen=True)
class BuildContext:
    """What building a component may need beyond its config.

    Parameters
    ----------
    masks : mapping of str to torch.Tensor, optional
        Explicit pruning masks (name -> bool/0-1 tensor) for ``mask:digest=...``;
        both the encoder and the decoder must hold the same ones.
    """

    masks: Mapping[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class StageConfig(ABC):
    """Base of every stage config.

    Class attributes
    ----------------
    name : str
        The stage's name in a spec string (``"topk"``, ``"uniform"``, ``"ef"``).
    kind : StageKind
        Which slot of the pipeline it fills.
    primary : str or None
        The field a bare first argument sets (``topk:0.01`` sets ``density``).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[StageKind] = "sparsifier"
    primary: ClassVar[str | None] = None

    @abstractmethod
    def build(self, context: BuildContext) -> Any:
        """Make the component this config describes."""

    def to_spec(self) -> str:
        """This stage alone in canonical spec syntax (``"uniform:4,chunk=256"``)."""
        from fedsync.compression.spec import format_stage

        return format_stage(self)


@dataclass(frozen=True)
class SparsifierConfig(StageConfig):
    """Base of sparsifier configs (which positions travel)."""

    kind: ClassVar[StageKind] = "sparsifier"

    @abstractmethod
    def build(self, context: BuildContext) -> Sparsifier:
        """Make the sparsifier this config describes."""

    def with_density(self, density: float) -> SparsifierConfig:
        """The same sparsifier keeping a fraction ``density`` of each tensor."""
        if "density" not in {f.name for f in dataclasses.fields(self)}:
            raise SpecError(f"{self.name}: this sparsifier has no density to override")
        return dataclasses.replace(self, density=density)  # type: ignore[call-arg]


@dataclass(frozen=True)
class QuantizerConfig(StageConfig):
    """Base of quantizer configs (how kept values become codes)."""

    kind: ClassVar[StageKind] = "quantizer"

    @abstractmethod
    def build(self, context: BuildContext) -> Quantizer:
        """Make the quantizer this config describes."""

    def with_bits(self, bits: int) -> QuantizerConfig:
        """The same quantizer with ``bits`` bits per code (if its width is tunable)."""
        raise SpecError(
            f"{self.name}: the code width is fixed; only uniform and qsgd take a bit width"
        )


@dataclass(frozen=True)
class PipelineConfig:
    """A sparsifier, a quantizer and optional error feedback.

    Parameters
    ----------
    sparsifier : SparsifierConfig, optional
        Default: ``none`` (every value, dense).
    quantizer : QuantizerConfig, optional
        Default: ``fp32`` (raw float32 bits).
    feedback : ErrorFeedbackConfig, optional
        Error feedback around the two; default none.

    Examples
    --------
    >>> from fedsync.compression import PipelineConfig
    >>> PipelineConfig.from_spec("topk:0.01+uniform:8+ef").to_spec()
    'topk:0.01+uniform:8+ef'
    """

    sparsifier: SparsifierConfig | None = None
    quantizer: QuantizerConfig | None = None
    feedback: ErrorFeedbackConfig | None = None

    def __post_init__(self) -> None:
        from fedsync.compression.registry import REGISTRY

        if self.sparsifier is None:
            object.__setattr__(self, "sparsifier", REGISTRY.lookup("none", "sparsifier")())
        if self.quantizer is None:
            object.__setattr__(self, "quantizer", REGISTRY.lookup("fp32", "quantizer")())
        for slot, value in (
            ("sparsifier", self.sparsifier),
            ("quantizer", self.quantizer),
            ("feedback", self.feedback),
        ):
            if value is not None and (not isinstance(value, StageConfig) or value.kind != slot):
                raise SpecError(f"PipelineConfig.{slot} must be a {slot} config, got {value!r}")

    @property
    def stages(self) -> tuple[StageConfig, ...]:
        """The configured stages in spec order."""
        parts: list[StageConfig | None] = [self.sparsifier, self.quantizer, self.feedback]
        return tuple(p for p in parts if p is not None)

    @classmethod
    def from_spec(cls, spec: str) -> PipelineConfig:
        """Parse a spec string (see :mod:`fedsync.compression.spec`)."""
        from fedsync.compression.spec import parse_spec

        return parse_spec(spec)

    def to_spec(self) -> str:
        """The canonical spec string of this config."""
        return "+".join(stage.to_spec() for stage in self.stages)

    def with_density(self, density: float) -> PipelineConfig:
        """This pipeline with the sparsifier keeping a fraction ``density``."""
        assert self.sparsifier is not None
        return dataclasses.replace(self, sparsifier=self.sparsifier.with_density(density))

    def with_bits(self, bits: int) -> PipelineConfig:
        """This pipeline with ``bits`` bits per quantized value."""
        assert self.quantizer is not None
        return dataclasses.replace(self, quantizer=self.quantizer.with_bits(bits))

    def __str__(self) -> str:
        return self.to_spec()
