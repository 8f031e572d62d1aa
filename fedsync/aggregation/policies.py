"""TEASQ-Fed, FedBuff and FedAsync as small policy objects.

A policy says *what* the asynchronous server does with arrivals; the loop in
``server/async_loop.py`` says *when*. Each policy is a handful of numbers:

=========  ====  ============  ======================  ================================
policy      K    weight        normalisation           compression
=========  ====  ============  ======================  ================================
teasq       K    n_i * s(τ)    by the weight sum       decaying (density, bits)
fedbuff     K    s(τ)          by K                    fixed
fedasync    1    α * s(τ)      by K (= 1)              fixed
=========  ====  ============  ======================  ================================

(``n_i``: the device's number of training examples, ``τ``: staleness, ``s``: the
staleness function, ``α``: FedAsync's mixing.) FedAsync is applied in its delta form:
``x += α s(τ) Δ_i`` the moment an update arrives -- the original mixes the device's
*model* into the global one, which would need the global model at every past version.
All three drop an update older than ``max_staleness`` (counted, never aggregated), and
cap in-flight tasks at the concurrency ``C``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedsync.aggregation.buffer import Normalization
from fedsync.aggregation.staleness import Polynomial, StalenessFunction, parse_staleness

__all__ = ["POLICIES", "AsyncPolicy", "build_policy", "fedasync", "fedbuff", "teasq"]


@dataclass(frozen=True)
class AsyncPolicy:
    """How an asynchronous server buffers, weights and gates updates.

    Parameters
    ----------
    name : str
        ``"teasq"``, ``"fedbuff"`` or ``"fedasync"`` (free text for custom policies).
    buffer_size : int
        ``K``: updates per aggregation, ``>= 1``.
    concurrency : int
        ``C``: most tasks in flight at once, ``>= 1``.
    staleness : StalenessFunction
        Weight of an update by its staleness.
    max_staleness : int or None
        Updates staler than this are dropped; ``None``: no limit.
    mixing : float
        Multiplies every update's weight (FedAsync's ``α``), in ``(0, 1]`` for FedAsync,
        ``> 0`` otherwise.
    normalization : {"count", "weight"}
        How the buffer turns its weighted sum into a mean (see
        :class:`~fedsync.aggregation.buffer.UpdateBuffer`).
    weight_by_examples : bool
        Multiply each weight by the device's number of training examples.
    decaying_compression : bool
        Follow the compression schedule's decay (TEASQ-Fed); otherwise keep its start
        values.
    """

    name: str
    buffer_size: int
    concurrency: int
    staleness: StalenessFunction = field(default_factory=lambda: Polynomial(0.5))
    max_staleness: int | None = None
    mixing: float = 1.0
    normalization: Normalization = "count"
    weight_by_examples: bool = False
    decaying_compression: bool = False

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"buffer-size (K) must be >= 1, got {self.buffer_size}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency (C) must be >= 1, got {self.concurrency}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(
                f"max-staleness must be >= 0 (or None for no limit), got {self.max_staleness}"
            )
        if not (math.isfinite(self.mixing) and self.mixing > 0.0):
            raise ValueError(f"mixing must be finite and > 0, got {self.mixing}")
        if self.normalization not in ("count", "weight"):
            raise ValueError(f"normalization must be 'count' or 'weight', got {self.normalization}")

    def accepts(self, staleness: int) -> bool:
        """Whether an update this stale may be aggregated at all."""
        return self.max_staleness is None or staleness <= self.max_staleness

    def weight(self, staleness: int, num_examples: int) -> float:
        """The aggregation weight of an accepted update.

        Parameters
        ----------
        staleness : int
            Aggregations since the device's model version, ``>= 0``.
        num_examples : int
            The device's training examples (used only with ``weight_by_examples``).
        """
        weight = self.mixing * self.staleness(staleness)
        if self.weight_by_examples:
            weight *= max(int(num_examples), 0)
        return weight


def teasq(
    *,
    concurrency: int = 5,
    buffer_size: int = 3,
    staleness: StalenessFunction | str = "polynomial:0.5",
    max_staleness: int | None = None,
) -> AsyncPolicy:
    """TEASQ-Fed: devices apply for tasks, cache K, data-size and staleness weights,
    decaying compression (Zhou et al., "TEASQ-Fed", 2023)."""
    return AsyncPolicy(
        name="teasq",
        buffer_size=buffer_size,
        concurrency=concurrency,
        staleness=_staleness(staleness),
        max_staleness=max_staleness,
        normalization="weight",
        weight_by_examples=True,
        decaying_compression=True,
    )


def fedbuff(
    *,
    concurrency: int = 5,
    buffer_size: int = 3,
    staleness: StalenessFunction | str = "polynomial:0.5",
    max_staleness: int | None = None,
) -> AsyncPolicy:
    """FedBuff: mean of K staleness-scaled updates (Nguyen et al., AISTATS 2022)."""
    return AsyncPolicy(
        name="fedbuff",
        buffer_size=buffer_size,
        concurrency=concurrency,
        staleness=_staleness(staleness),
        max_staleness=max_staleness,
        normalization="count",
    )


def fedasync(
    *,
    concurrency: int = 5,
    alpha: float = 0.6,
    staleness: StalenessFunction | str = "polynomial:0.5",
    max_staleness: int | None = None,
) -> AsyncPolicy:
    """FedAsync: every update applied at once, scaled by ``α s(τ)`` (Xie et al., 2019)."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"fedasync-alpha must be in (0, 1], got {alpha}")
    return AsyncPolicy(
        name="fedasync",
        buffer_size=1,
        concurrency=concurrency,
        staleness=_staleness(staleness),
        max_staleness=max_staleness,
        mixing=alpha,
        normalization="count",
    )


POLICIES = ("teasq", "fedbuff", "fedasync")
"""Policy names :func:`build_policy` knows (the ``strategy`` run-config values)."""


def build_policy(
    name: str,
    *,
    concurrency: int = 5,
    buffer_size: int = 3,
    staleness: StalenessFunction | str = "polynomial:0.5",
    max_staleness: int | None = None,
    fedasync_alpha: float = 0.6,
) -> AsyncPolicy:
    """Build a policy by name (``buffer_size`` is ignored by ``fedasync``: K = 1).

    Raises
    ------
    ValueError
        If the name is unknown or a value is out of range.
    """
    key = name.strip().lower()
    if key == "teasq":
        return teasq(
            concurrency=concurrency,
            buffer_size=buffer_size,
            staleness=staleness,
            max_staleness=max_staleness,
        )
    if key == "fedbuff":
        return fedbuff(
            concurrency=concurrency,
            buffer_size=buffer_size,
            staleness=staleness,
            max_staleness=max_staleness,
        )
    if key == "fedasync":
        return fedasync(
            concurrency=concurrency,
            alpha=fedasync_alpha,
            staleness=staleness,
            max_staleness=max_staleness,
        )
    raise ValueError(f"unknown async policy {name!r}; known: {', '.join(POLICIES)}")


def _staleness(value: StalenessFunction | str) -> StalenessFunction:
    return parse_staleness(value) if isinstance(value, str) else value
