"""FedAsync (Xie et al., 2019) in its delta form: every update applied at once.

``x += alpha s(tau) Delta_i`` the moment an update arrives (K = 1). The paper's own
form mixes the device's *model* into the global one: :class:`~fedsync.strategies.FedAsyncMix`
(:mod:`fedsync.strategies.fedasync_mix`).
"""

from __future__ import annotations

from typing import Any

from fedsync.config import AsyncSection, RunConfig, settings_error
from fedsync.strategies.base import Arrival, Strategy

__all__ = ["FedAsync"]


class FedAsync(Strategy):
    """FedAsync, delta form: ``x += alpha s(tau) Delta``, one update per aggregation.

    Parameters
    ----------
    alpha : float
        The weight ``alpha`` in ``(0, 1]`` (run-config key ``fedasync-alpha``).
    **kwargs
        See :class:`~fedsync.strategies.Strategy`.
    """

    name = "fedasync"
    normalization = "count"

    def __init__(self, *, alpha: float = 0.6, **kwargs: Any) -> None:
        kwargs.setdefault("buffer_size", 1)
        super().__init__(fedasync_alpha=alpha, **kwargs)

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Refuse a ``buffer-mean`` that divides by the weights: each update is mixed in
        by its own weight, which such a mean would cancel."""
        mean = config.asynchronous.buffer_mean
        if mean not in ("auto", "count"):
            raise settings_error(
                "buffer-mean",
                f"{cls.name} mixes each update in by its own weight (fedasync-alpha x "
                "staleness), which a mean over the weights would cancel: leave it auto",
                mean,
            )

    def configure(self, settings: AsyncSection) -> None:
        """The base numbers and ``alpha``."""
        super().configure(settings)
        self.alpha = settings.fedasync_alpha
        """The weight of every update (times ``s(staleness)``)."""

    def cached_updates(self, settings: AsyncSection) -> int:
        """Always 1: every update is applied the moment it arrives."""
        return 1

    def weight(self, arrival: Arrival) -> float:
        """``alpha * s(staleness)``."""
        return self.alpha * self.staleness(arrival.staleness)

    def describe(self) -> dict[str, object]:
        """The base numbers plus ``alpha``."""
        return {**super().describe(), "alpha": self.alpha}
