"""FedBuff (Nguyen et al., AISTATS 2022): the mean of K staleness-scaled updates.

``x += eta / K * sum_i s(tau_i) Delta_i``: staleness weights shrink the step.
"""

from __future__ import annotations

from fedsync.strategies.base import Strategy

__all__ = ["FedBuff"]


class FedBuff(Strategy):
    """FedBuff: cache K updates, each weighted by ``s(staleness)``, divide by K.

    Parameters: see :class:`~fedsync.strategies.Strategy` (every keyword argument).
    """

    name = "fedbuff"
    normalization = "count"
