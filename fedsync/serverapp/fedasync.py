"""FedAsync as a strategy object: every update mixed into the model as it arrives
(:class:`fedsync.strategies.FedAsync` is its engine policy)."""

from __future__ import annotations

from typing import Any

from fedsync.serverapp.strategy import AsyncStrategy

__all__ = ["FedAsync"]


class FedAsync(AsyncStrategy):
    """FedAsync (Xie et al., 2019): ``x = (1 - a_t) x + a_t x_i`` with ``a_t = alpha *
    s(staleness)``, one update per aggregation.

    Parameters
    ----------
    alpha : float
        The mixing weight ``alpha`` in ``(0, 1]`` (run-config key ``fedasync-alpha``).
    **kwargs
        See :class:`~fedsync.serverapp.strategy.AsyncStrategy`.
    """

    name = "fedasync"

    def __init__(self, *, alpha: float = 0.6, **kwargs: Any) -> None:
        kwargs.setdefault("buffer_size", 1)
        super().__init__(fedasync_alpha=alpha, **kwargs)
