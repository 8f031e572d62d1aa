"""Staleness weights: how much an update that started from an old model still counts.

An update's *staleness* ``s`` is the number of global aggregations that happened
between the moment its device received the model and the moment its reply is
aggregated (``s = 0``: nothing changed meanwhile). Each function here maps ``s`` to a
non-negative weight; the buffer multiplies the update by that weight.

* ``constant`` -- ``1`` (plain FedBuff).
* ``polynomial:a`` -- ``(1 + s) ** -a`` (FedAsync, FedBuff's ``1/sqrt(1+s)`` is ``a=0.5``).
* ``hinge:a:b`` -- ``1`` if ``s <= b`` else ``1 / (a (s - b) + 1)`` (FedAsync's hinge).
* ``normalized-polynomial:a:m`` -- ``((1 + m) / (1 + s)) ** a``: the polynomial divided by
  its value at a typical staleness ``m`` (as FLSim normalises its staleness weights), so
  an update of average staleness keeps weight 1 and the server learning rate keeps its
  meaning when the concurrency changes.

Functions are built from a short spec string (the ``staleness`` run-config key) with
:func:`parse_staleness`; :data:`STALENESS_FUNCTIONS` is the registry by name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "STALENESS_FUNCTIONS",
    "Constant",
    "Hinge",
    "NormalizedPolynomial",
    "Polynomial",
    "StalenessFunction",
    "parse_staleness",
]


class StalenessFunction(ABC):
    """Maps a staleness (aggregations missed, ``>= 0``) to a weight in ``[0, 1]``-ish.

    Subclasses implement :meth:`weight`; calling the object checks the argument.
    """

    name: str = ""

    def __call__(self, staleness: int) -> float:
        if staleness < 0:
            # A negative staleness means a version counter went backwards: a bug, not data.
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        return self.weight(int(staleness))

    @abstractmethod
    def weight(self, staleness: int) -> float:
        """The weight of an update ``staleness`` aggregations old."""

    @abstractmethod
    def spec(self) -> str:
        """The spec string that rebuilds this function with :func:`parse_staleness`."""

    def __repr__(self) -> str:
        return f"StalenessFunction({self.spec()!r})"


@dataclass(frozen=True, repr=False)
class Constant(StalenessFunction):
    """Every update counts fully, however old."""

    name = "constant"

    def weight(self, staleness: int) -> float:
        return 1.0

    def spec(self) -> str:
        return "constant"


@dataclass(frozen=True, repr=False)
class Polynomial(StalenessFunction):
    """``(1 + s) ** -a``.

    Parameters
    ----------
    a : float
        Decay exponent, ``>= 0`` (``0`` is constant; ``0.5`` is FedBuff's choice).
    """

    a: float = 0.5
    name = "polynomial"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a >= 0.0):
            raise ValueError(
                f"polynomial staleness exponent a must be finite and >= 0, got {self.a}"
            )

    def weight(self, staleness: int) -> float:
        return float((1.0 + staleness) ** -self.a)

    def spec(self) -> str:
        return f"polynomial:{self.a:g}"


@dataclass(frozen=True, repr=False)
class Hinge(StalenessFunction):
    """``1`` up to ``b`` missed aggregations, then ``1 / (a (s - b) + 1)``.

    Parameters
    ----------
    a : float
        Slope of the decay after the hinge, ``>= 0``.
    b : float
        Staleness tolerated at full weight, ``>= 0``.
    """

    a: float = 10.0
    b: float = 4.0
    name = "hinge"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a >= 0.0):
            raise ValueError(f"hinge staleness slope a must be finite and >= 0, got {self.a}")
        if not (math.isfinite(self.b) and self.b >= 0.0):
            raise ValueError(f"hinge staleness knee b must be finite and >= 0, got {self.b}")

    def weight(self, staleness: int) -> float:
        if staleness <= self.b:
            return 1.0
        return 1.0 / (self.a * (staleness - self.b) + 1.0)

    def spec(self) -> str:
        return f"hinge:{self.a:g}:{self.b:g}"


@dataclass(frozen=True, repr=False)
class NormalizedPolynomial(StalenessFunction):
    """``((1 + m) / (1 + s)) ** a``: the polynomial, scaled to 1 at staleness ``m``.

    Parameters
    ----------
    a : float
        Decay exponent, ``>= 0``.
    average : float
        The staleness that keeps weight 1 (typically about the concurrency divided by
        the buffer size); ``>= 0``. Updates fresher than that weigh more than 1.
    """

    a: float = 0.5
    average: float = 0.0
    name = "normalized-polynomial"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a >= 0.0):
            raise ValueError(
                f"normalized-polynomial exponent a must be finite and >= 0, got {self.a}"
            )
        if not (math.isfinite(self.average) and self.average >= 0.0):
            raise ValueError(
                f"normalized-polynomial average staleness must be finite and >= 0, "
                f"got {self.average}"
            )

    def weight(self, staleness: int) -> float:
        return float(((1.0 + self.average) / (1.0 + staleness)) ** self.a)

    def spec(self) -> str:
        return f"normalized-polynomial:{self.a:g}:{self.average:g}"


STALENESS_FUNCTIONS: dict[str, tuple[Callable[..., StalenessFunction], tuple[str, ...]]] = {
    "constant": (Constant, ()),
    "polynomial": (Polynomial, ("a",)),
    "hinge": (Hinge, ("a", "b")),
    "normalized-polynomial": (NormalizedPolynomial, ("a", "average")),
}
"""Name -> (constructor, positional parameter names) for :func:`parse_staleness`."""

_ALIASES = {"const": "constant", "poly": "polynomial", "normpoly": "normalized-polynomial"}


def parse_staleness(spec: str) -> StalenessFunction:
    """Build a staleness function from a spec string.

    The spec is the function's name followed by its parameters, separated by ``:``,
    either positional (``"hinge:10:4"``) or named (``"hinge:a=10:b=4"``); parameters
    left out keep their defaults.

    Parameters
    ----------
    spec : str
        ``"constant"``, ``"polynomial:0.5"``, ``"hinge:10:4"``,
        ``"normalized-polynomial:0.5:3"`` (aliases ``const``, ``poly``, ``normpoly``).

    Raises
    ------
    ValueError
        If the name is unknown, a parameter is not a number, there are too many
        parameters, or a value is out of range.
    """
    parts = [part.strip() for part in spec.strip().split(":")]
    name = _ALIASES.get(parts[0].lower(), parts[0].lower())
    if name not in STALENESS_FUNCTIONS:
        known = ", ".join(sorted(STALENESS_FUNCTIONS))
        raise ValueError(f"unknown staleness function {parts[0]!r} in {spec!r}; known: {known}")
    factory, param_names = STALENESS_FUNCTIONS[name]
    args = [part for part in parts[1:] if part]
    if len(args) > len(param_names):
        raise ValueError(
            f"staleness {name!r} takes at most {len(param_names)} parameter(s) "
            f"({', '.join(param_names) or 'none'}), got {len(args)} in {spec!r}"
        )
    kwargs: dict[str, float] = {}
    for position, arg in enumerate(args):
        key, value = arg.split("=", 1) if "=" in arg else (param_names[position], arg)
        key = key.strip()
        if key not in param_names:
            raise ValueError(f"staleness {name!r} has no parameter {key!r} (in {spec!r})")
        try:
            kwargs[key] = float(value)
        except ValueError:
            raise ValueError(
                f"staleness parameter {key!r} must be a number, got {value!r} in {spec!r}"
            ) from None
    return factory(**kwargs)
