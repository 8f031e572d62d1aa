"""The spec grammar: a short string that names a whole compressor pipeline.

Grammar
-------
::

    spec   := stage ("+" stage)*         at most one of each kind, in the order
                                          sparsifier, rotation, quantizer, feedback
    stage  := name [":" args]
    args   := arg ("," arg)*
    arg    := value | key "=" value       a bare value (first only) sets the stage's
                                          primary field (density, bits, levels)
    name, key := [a-z][a-z0-9_]*          case-insensitive, whitespace ignored
    value  := [A-Za-z0-9_.-]+             int, float, bool (true/false/on/off/1/0)
                                          or a word, by the field's type

A missing sparsifier means ``none`` (dense), a missing quantizer ``fp32``, a missing
rotation none; ``none`` in the quantizer slot is ``fp32``. Examples::

    topk:0.01+uniform:8+ef
    dgc:0.001,sample=0.01+qsgd:16+ef:momentum=0.9
    sidco:0.01,dist=gpd+sign+ef
    none+fp16
    mask:0.1,seed=3+uniform:4
    powersgd:4,min_rate=2.0,fallback=fp16+uniform:8+ef
    none+rht+uniform:4+ef

The canonical form (what :func:`format_spec` writes and the frame carries) names the
sparsifier and the quantizer always, the rotation when there is one, the primary
value always, other keys only when they differ from their defaults, in field order;
floats as Python's shortest round-trip ``repr``. ``format_spec(parse_spec(s))`` is idempotent and
``parse_spec(format_spec(c)) == c``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedsync.compression.config import (
    MAX_STAGE_INT,
    STAGE_ORDER,
    QuantizerConfig,
    RotationConfig,
    SparsifierConfig,
    StageConfig,
    StageKind,
    format_stage,
    stage_fields,
)
from fedsync.compression.errors import SpecError
from fedsync.compression.registry import REGISTRY

if TYPE_CHECKING:
    from fedsync.compression.error_feedback import ErrorFeedbackConfig

__all__ = ["PipelineConfig", "format_spec", "format_stage", "parse_spec", "parse_stage"]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}


def _convert(stage: str, key: str, text: str, annotation: Any) -> Any:
    """Turn ``text`` into a value of the field's annotated type."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in args:
            return None
        annotation = next(a for a in args if a is not type(None))
    try:
        if annotation is bool:
            low = text.lower()
            if low in _TRUE | _FALSE:
                return low in _TRUE
            raise ValueError
        if annotation is int:
            # Digits are bounded before converting: a 64-bit int has at most 19.
            number = int(text) if len(text.lstrip("+-")) <= 19 else None
            if number is None or not -MAX_STAGE_INT - 1 <= number <= MAX_STAGE_INT:
                shown = f"{text[:20]!r}{'...' if len(text) > 20 else ''}"
                raise SpecError(
                    f"{stage}: {key} must be an int of at most 64 bits, got {shown} "
                    f"({len(text)} characters)"
                )
            return number
        if annotation is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if annotation is str:
            return text.lower()
    except SpecError:
        raise
    except ValueError:
        pass
    kind = getattr(annotation, "__name__", str(annotation))
    raise SpecError(f"{stage}: {key} must be {kind}, got {text!r}")


@dataclass(frozen=True)
class PipelineConfig:
    """A sparsifier, an optional rotation, a quantizer and optional error feedback.

    Parameters
    ----------
    sparsifier : SparsifierConfig, optional
        Default: ``none`` (every value, dense).
    quantizer : QuantizerConfig, optional
        Default: ``fp32`` (raw float32 bits).
    feedback : ErrorFeedbackConfig, optional
        Error feedback around the others; default none.
    rotation : RotationConfig, optional
        A rotation of the kept values before they are quantized (``rht``); default
        none. Last so the three older fields keep their positions; a spec lists it
        between the sparsifier and the quantizer.

    Examples
    --------
    >>> from fedsync.compression import PipelineConfig
    >>> PipelineConfig.from_spec("topk:0.01+uniform:8+ef").to_spec()
    'topk:0.01+uniform:8+ef'
    """

    sparsifier: SparsifierConfig | None = None
    quantizer: QuantizerConfig | None = None
    feedback: ErrorFeedbackConfig | None = None
    rotation: RotationConfig | None = None

    def __post_init__(self) -> None:
        if self.sparsifier is None:
            object.__setattr__(self, "sparsifier", REGISTRY.lookup("none", "sparsifier")())
        if self.quantizer is None:
            object.__setattr__(self, "quantizer", REGISTRY.lookup("fp32", "quantizer")())
        for slot, value in (
            ("sparsifier", self.sparsifier),
            ("rotation", self.rotation),
            ("quantizer", self.quantizer),
            ("feedback", self.feedback),
        ):
            if value is not None and (not isinstance(value, StageConfig) or value.kind != slot):
                raise SpecError(f"PipelineConfig.{slot} must be a {slot} config, got {value!r}")

    @property
    def stages(self) -> tuple[StageConfig, ...]:
        """The configured stages in spec order."""
        parts: list[StageConfig | None] = [
            self.sparsifier,
            self.rotation,
            self.quantizer,
            self.feedback,
        ]
        return tuple(p for p in parts if p is not None)

    @classmethod
    def from_spec(cls, spec: str) -> PipelineConfig:
        """Parse a spec string (the grammar is in the module docstring)."""
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


def parse_stage(text: str, kind: StageKind) -> StageConfig:
    """Parse one stage (``"uniform:4,chunk=256"``) of the given kind."""
    head, sep, tail = text.partition(":")
    name = head.strip().lower()
    cls = REGISTRY.lookup(name, kind)
    types_ = stage_fields(cls)
    values: dict[str, Any] = {}
    if sep:
        args = [a.strip() for a in tail.split(",")]
        for position, arg in enumerate(args):
            if not arg:
                raise SpecError(f"{name}: empty argument in {text.strip()!r}")
            key, eq, value = arg.partition("=")
            if not eq:
                if position != 0 or cls.primary is None:
                    takes = (
                        f"only its first argument bare ({cls.primary})"
                        if cls.primary
                        else "no bare argument"
                    )
                    raise SpecError(
                        f"{name}: bare value {arg!r}: {name} takes {takes}; use key=value "
                        f"with keys: {', '.join(types_) or '(none)'}"
                    )
                key, value = cls.primary, arg
            key, value = key.strip().lower(), value.strip()
            if key not in types_:
                raise SpecError(
                    f"{name}: unknown key {key!r}; valid keys: {', '.join(types_) or '(none)'}"
                )
            if key in values:
                raise SpecError(f"{name}: {key} given twice")
            if not _VALUE.match(value):
                raise SpecError(f"{name}: {key} has a malformed value {value!r}")
            values[key] = _convert(name, key, value, types_[key])
    try:
        return cls(**values)
    except SpecError:
        raise
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{name}: {exc}") from exc


def parse_spec(spec: str) -> PipelineConfig:
    """Parse a spec string into a :class:`PipelineConfig`.

    Raises
    ------
    SpecError
        For an empty or malformed string, an unknown stage, key or value, a stage out
        of order or repeated; the message lists what is valid.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty compressor spec; valid stages: {REGISTRY.describe()}")
    found: dict[StageKind, StageConfig] = {}
    slot = 0
    for raw in spec.split("+"):
        text = raw.strip()
        if not text:
            raise SpecError(f"empty stage in spec {spec!r} (stages are joined by '+')")
        name = text.partition(":")[0].strip().lower()
        if not _NAME.match(name):
            raise SpecError(f"malformed stage name {name!r} in spec {spec!r}")
        kind = next((k for k in STAGE_ORDER[slot:] if REGISTRY.find(name, k) is not None), None)
        if kind is None:
            earlier = [k for k in STAGE_ORDER[:slot] if REGISTRY.find(name, k) is not None]
            if earlier:
                raise SpecError(
                    f"stage {name!r} ({earlier[0]}) is repeated or out of order in {spec!r}; "
                    f"the order is {' + '.join(STAGE_ORDER)}"
                )
            every = sorted({n for k in STAGE_ORDER for n in REGISTRY.names(k)})
            close = difflib.get_close_matches(name, every, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpecError(
                f"unknown stage {name!r} in spec {spec!r}{hint} ({REGISTRY.describe()})"
            )
        found[kind] = parse_stage(text, kind)
        slot = STAGE_ORDER.index(kind) + 1
    return PipelineConfig(
        sparsifier=found.get("sparsifier"),  # type: ignore[arg-type]
        quantizer=found.get("quantizer"),  # type: ignore[arg-type]
        feedback=found.get("feedback"),  # type: ignore[arg-type]
        rotation=found.get("rotation"),  # type: ignore[arg-type]
    )


def format_spec(config: PipelineConfig) -> str:
    """The canonical spec string of ``config``."""
    return config.to_spec()
