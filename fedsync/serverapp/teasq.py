"""TEASQ-Fed as a strategy object: K cached updates weighted by data size and staleness,
decaying compression (:class:`fedsync.strategies.TEASQ` is its engine policy)."""

from __future__ import annotations

from fedsync.serverapp.strategy import AsyncStrategy

__all__ = ["TEASQ"]


class TEASQ(AsyncStrategy):
    """TEASQ-Fed: ``x += eta * sum_i n_i s(tau_i) Delta_i / sum_i n_i s(tau_i)``, the
    uplink's density and bit width decaying with the model version. Parameters: see
    :class:`~fedsync.serverapp.strategy.AsyncStrategy`."""

    name = "teasq"
