"""Typed stage configuration: one frozen dataclass per stage, and its canonical text.

Every stage config is a frozen dataclass registered under its spec name (see
:mod:`fedsync.compression.registry`); its fields are the spec's keys, its
``__post_init__`` validates them and says why a value is wrong, ``build`` makes the
component and ``to_spec`` writes the stage in canonical spec syntax. The pipeline of
stages, :class:`~fedsync.compression.spec.PipelineConfig`, and the parser live in
:mod:`fedsync.compression.spec`, above the registry: the imports run one way,
``config <- registry <- spec``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from fedsync.compression.errors import SpecError

if TYPE_CHECKING:
    from fedsync.compression.base import Quantizer, Rotation, Sparsifier

__all__ = [
    "MAX_STAGE_INT",
    "STAGE_ORDER",
    "BuildContext",
    "QuantizerConfig",
    "RotationConfig",
    "SparsifierConfig",
    "StageConfig",
    "StageKind",
    "check_density",
    "check_range",
    "format_stage",
    "stage_fields",
]

MAX_STAGE_INT = (1 << 63) - 1
"""Largest magnitude of an integer stage field: the kernels take them as int64, so
the spec parser and the configs reject anything wider before it reaches one."""

StageKind = Literal["sparsifier", "rotation", "quantizer", "feedback"]
"""The slots of a pipeline, in the order a spec lists them (only the rotation may be
left out of a canonical spec: see :mod:`fedsync.compression.spec`)."""

STAGE_ORDER: tuple[StageKind, ...] = ("sparsifier", "rotation", "quantizer", "feedback")


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
class RotationConfig(StageConfig):
    """Base of rotation configs (an orthonormal map of the kept values before they are
    quantized, undone by the receiver after it dequantizes them)."""

    kind: ClassVar[StageKind] = "rotation"

    @abstractmethod
    def build(self, context: BuildContext) -> Rotation:
        """Make the rotation this config describes."""


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


def stage_fields(cls: type[StageConfig]) -> dict[str, Any]:
    """A stage config's fields (the spec's keys, in order) and their resolved types."""
    return dict(_stage_fields(cls))


@functools.cache
def _stage_fields(cls: type[StageConfig]) -> tuple[tuple[str, Any], ...]:
    # Resolving the annotations is the slow part of parsing a spec, and a class's
    # never change: once per class and process.
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_stage(config: StageConfig) -> str:
    """One stage in canonical form: primary value, then non-default keys in order."""
    parts: list[str] = []
    primary = type(config).primary
    types_ = stage_fields(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and float
            in (
                types_[f.name],
                *typing.get_args(types_[f.name]),
            )
        ):
            value = float(value)  # a typed config may hold 1 where the spec says 1.0
        if f.name == primary:
            if value is not None:
                parts.insert(0, _format_value(value))
            continue
        if value is None or (f.default is not dataclasses.MISSING and value == f.default):
            continue
        parts.append(f"{f.name}={_format_value(value)}")
    return config.name + (":" + ",".join(parts) if parts else "")
