"""FedAsync (Xie et al., 2019) in its delta form: every update applied at once.

``x += alpha s(tau) Delta_i`` the moment an update arrives (K = 1). The paper's own
form mixes the device's *model* into the global one: see
:mod:`fedsync.strategies.fedasync_mix`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedsync.strategies.base import Arrival, Strategy

if TYPE_CHECKING:
    from fedsync.config import AsyncSection

__all__ = ["FedAsync"]


class FedAsync(Strategy):
    """K = 1; weight ``alpha s(tau)`` (``fedasync-alpha``)."""

    name = "fedasync"
    normalization = "count"

    def __init__(self, settings: AsyncSection) -> None:
        super().__init__(settings)
        self.alpha = settings.fedasync_alpha

    def cached_updates(self, settings: AsyncSection) -> int:
        """Always 1: every update is applied the moment it arrives."""
        return 1

    def weight(self, arrival: Arrival) -> float:
        """``alpha * s(staleness)``."""
        return self.alpha * self.staleness(arrival.staleness)

    def describe(self) -> dict[str, object]:
        """The base numbers plus ``alpha``."""
        return {**super().describe(), "alpha": self.alpha}
