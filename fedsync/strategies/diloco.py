"""Synchronous rounds on the engine: DiLoCo (Douillard et al., 2023) and its relatives.

Every round hands the current model to ``C`` sites, waits for all ``C`` pseudo-gradients
and steps the model once with their mean: ``K = C`` (``buffer-size`` is not used), and
the server's loop dispatches no task of a round before the previous round's step
(:attr:`~fedsync.strategies.Strategy.synchronous`), so every update has staleness 0.
With ``client-optimizer = adamw``, ``local-steps = H`` and ``server-optimizer =
nesterov`` (0.7 / 0.9) this is DiLoCo; its pseudo-gradients go through the run's codecs
like any other update (``none+uniform:8``: INTELLECT-1's int8; top-k + 2-bit + EF:
SparseLoCo-style).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsync.strategies.base import Arrival, Strategy

if TYPE_CHECKING:
    from fedsync.config import AsyncSection

__all__ = ["DiLoCo"]


class DiLoCo(Strategy):
    """DiLoCo: each round's ``concurrency`` pseudo-gradients averaged (staleness 0), then
    an outer Nesterov step (learning rate 0.7, momentum 0.9 by default). The sites' inner
    loop is the application's (DiLoCo's: AdamW for H steps).

    Parameters
    ----------
    **kwargs
        See :class:`~fedsync.strategies.Strategy`; ``buffer_size`` is not used (K = C).
    """

    name = "diloco"
    normalization = "count"
    synchronous = True

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("server_optimizer", "nesterov")
        kwargs.setdefault("server_learning_rate", 0.7)
        kwargs.setdefault("uplink_codec", "none+fp32")
        super().__init__(**kwargs)

    def cached_updates(self, settings: AsyncSection) -> int:
        """``K = C``: a round is one update from each site in flight."""
        return settings.concurrency

    def accepts(self, arrival: Arrival) -> bool:
        """Only updates of the current round (the loop never makes stale ones)."""
        return arrival.staleness == 0
