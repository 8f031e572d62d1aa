"""TEASQ-Fed (Zhou et al., 2023): devices apply for work, K cached updates weighted by
data size and staleness, decaying compression.

``x += eta * sum_i w_i Delta_i / sum_i w_i`` with ``w_i = n_i s(tau_i)``: a convex
combination, so staleness re-balances the updates but never shortens the step; the
density and bit width of the uplink decay with the model version.
"""

from __future__ import annotations

from fedsync.strategies.base import Arrival, Strategy

__all__ = ["TEASQ"]


class TEASQ(Strategy):
    """TEASQ-Fed: ``x += eta * sum_i n_i s(tau_i) Delta_i / sum_i n_i s(tau_i)``, the
    uplink's density and bit width decaying with the model version.

    Parameters: see :class:`~fedsync.strategies.Strategy` (every keyword argument).
    """

    name = "teasq"
    normalization = "weight"
    decaying_compression = True

    def check(self, arrival: Arrival) -> str:
        """The device's example count is its weight: it must be positive."""
        if arrival.num_examples <= 0:
            return "reply lacks a positive num-examples (the weight of its update)"
        return ""

    def weight(self, arrival: Arrival) -> float:
        """``s(staleness) * num_examples``."""
        weight = self.staleness(arrival.staleness)
        weight *= max(int(arrival.num_examples), 0)
        return weight
