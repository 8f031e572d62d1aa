"""The registry of stage configs, by kind and spec name.

A stage joins the pipeline by decorating its config dataclass with :func:`register`;
the spec parser, :class:`~fedsync.compression.spec.PipelineConfig` and the decoder
only ever look names up here, so adding a compressor touches no factory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from fedsync.compression.config import STAGE_ORDER, StageConfig, StageKind
from fedsync.compression.errors import SpecError

__all__ = ["REGISTRY", "StageRegistry", "register"]

C = TypeVar("C", bound=type[StageConfig])


class StageRegistry:
    """Stage config classes by kind and name (plus aliases)."""

    def __init__(self) -> None:
        self._by_kind: dict[StageKind, dict[str, type[StageConfig]]] = {k: {} for k in STAGE_ORDER}

    def add(self, cls: type[StageConfig], aliases: Iterable[str] = ()) -> None:
        """Register ``cls`` under ``cls.name`` and ``aliases`` within its kind."""
        if not cls.name or not cls.name.isidentifier() or cls.name != cls.name.lower():
            raise ValueError(
                f"{cls.__name__}.name must be a lowercase identifier, got {cls.name!r}"
            )
        table = self._by_kind[cls.kind]
        for name in (cls.name, *aliases):
            if name in table and table[name] is not cls:
                raise ValueError(
                    f"{cls.kind} {name!r} is already registered by {table[name].__name__}"
                )
            table[name] = cls

    def find(self, name: str, kind: StageKind) -> type[StageConfig] | None:
        """The config class registered as ``name`` for ``kind``, or ``None``."""
        return self._by_kind[kind].get(name)

    def lookup(self, name: str, kind: StageKind) -> type[StageConfig]:
        """Like :meth:`find` but raise :class:`SpecError` listing the valid names."""
        cls = self.find(name, kind)
        if cls is None:
            raise SpecError(f"unknown {kind} {name!r}; valid: {', '.join(self.names(kind))}")
        return cls

    def names(self, kind: StageKind) -> list[str]:
        """Registered names (aliases included) of one kind, sorted."""
        return sorted(self._by_kind[kind])

    def describe(self) -> str:
        """One line per kind listing its names, for error messages."""
        return "; ".join(f"{kind}: {', '.join(self.names(kind))}" for kind in STAGE_ORDER)


REGISTRY = StageRegistry()
"""The process-wide registry the spec parser and the decoder use."""


def register(*aliases: str) -> Callable[[C], C]:
    """Class decorator: add a stage config to :data:`REGISTRY` (with aliases)."""

    def decorate(cls: C) -> C:
        REGISTRY.add(cls, aliases)
        return cls

    return decorate
