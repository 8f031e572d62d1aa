"""FedBuff as a strategy object: K buffered updates, averaged, staleness-weighted
(:class:`fedsync.strategies.FedBuff` is its engine policy)."""

from __future__ import annotations

from fedsync.serverapp.strategy import AsyncStrategy

__all__ = ["FedBuff"]


class FedBuff(AsyncStrategy):
    """FedBuff (Nguyen et al., 2022). Parameters: see
    :class:`~fedsync.serverapp.strategy.AsyncStrategy`; the uplink schedule stays at its
    start values (no decay)."""

    name = "fedbuff"
