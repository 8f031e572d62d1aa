"""DiLoCo as a strategy object: synchronous rounds of ``concurrency`` sites, H local
steps each, an outer Nesterov step (:class:`fedsync.strategies.DiLoCo` is its engine
policy)."""

from __future__ import annotations

from typing import Any

from fedsync.serverapp.strategy import AsyncStrategy

__all__ = ["DiLoCo"]


class DiLoCo(AsyncStrategy):
    """DiLoCo (Douillard et al., 2023): each round's ``concurrency`` pseudo-gradients
    averaged, then an outer Nesterov step (learning rate 0.7, momentum 0.9 by default).
    The sites' inner loop is the application's (DiLoCo's: AdamW for H steps).

    Parameters
    ----------
    **kwargs
        See :class:`~fedsync.serverapp.strategy.AsyncStrategy`.
    """

    name = "diloco"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("server_optimizer", "nesterov")
        kwargs.setdefault("server_learning_rate", 0.7)
        kwargs.setdefault("uplink_codec", "none+fp32")
        super().__init__(**kwargs)
