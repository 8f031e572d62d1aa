"""The base of fedsync's asynchronous strategies: a few numbers and a few hooks.

The engine (:mod:`fedsync.engine`) runs every strategy the same way::

    reply -> check() -> accepts() (staleness gate) -> weight() -> contribution()
          -> buffer (K cached) -> optimizer step -> version + 1

A strategy says *what* happens at each arrow; the engine says *when*. A new strategy
is one file here: subclass :class:`Strategy`, set :attr:`Strategy.name`, override the
hooks that differ, and add the class to :data:`fedsync.strategies.STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from fedsync.aggregation.buffer import Normalization
from fedsync.aggregation.staleness import StalenessFunction, parse_staleness
from fedsync.updates import SparseTensor

if TYPE_CHECKING:
    from fedsync.config import AsyncSection

__all__ = ["Arrival", "Contribution", "Strategy"]

Contribution = Mapping[str, Any]
"""What goes into the buffer per tensor: a :class:`~fedsync.updates.SparseTensor`, or a
dense ``torch.Tensor`` of the tensor's shape."""


@dataclass(frozen=True)
class Arrival:
    """A decoded, valid update as a strategy judges it.

    Attributes
    ----------
    staleness : int
        Aggregations since the model version the task started from.
    num_examples : int
        The device's training examples, as its reply says.
    version : int
        The model version the task started from.
    """

    staleness: int
    num_examples: int
    version: int


class Strategy:
    """Buffering, weighting and gating of asynchronous updates.

    Parameters
    ----------
    settings : fedsync.config.AsyncSection
        ``concurrency``, ``buffer-size``, ``staleness``, ``max-staleness`` and the
        strategy's own keys.

    Class attributes
    ----------------
    name : str
        The ``strategy`` run-config value.
    normalization : {"count", "weight", "selected"}
        How the buffer turns its weighted sum into a mean (see
        :class:`~fedsync.aggregation.buffer.UpdateBuffer`), unless run-config
        ``buffer-mean`` names another (:attr:`mean` is the one in use).
    decaying_compression : bool
        Follow the compression schedule's decay (TEASQ-Fed); otherwise its start values.
    needs_start_model : bool
        :meth:`contribution` needs the model each update started from (the engine then
        keeps the decoded downlink of every task in flight).
    synchronous : bool
        Rounds: the server's loop plans no task from a model version once ``K`` tasks of
        it are buffered or in flight, so the next tasks start from the stepped model and
        every update has staleness 0.
    """

    name: ClassVar[str] = ""
    normalization: ClassVar[Normalization] = "count"
    decaying_compression: ClassVar[bool] = False
    needs_start_model: ClassVar[bool] = False
    synchronous: ClassVar[bool] = False

    def __init__(self, settings: AsyncSection) -> None:
        self.concurrency = settings.concurrency
        self.buffer_size = self.cached_updates(settings)
        self.mean: Normalization = (
            self.normalization
            if settings.buffer_mean == "auto"
            else cast(Normalization, settings.buffer_mean)
        )
        """How this run's buffer turns its weighted sum into a mean."""
        self.staleness: StalenessFunction = parse_staleness(settings.staleness)
        self.max_staleness: int | None = (
            None if settings.max_staleness < 0 else settings.max_staleness
        )

    # --- hooks ------------------------------------------------------------------------------------
    def cached_updates(self, settings: AsyncSection) -> int:
        """``K``: updates per aggregation (default: ``buffer-size``)."""
        return settings.buffer_size

    def check(self, arrival: Arrival) -> str:
        """``""`` if the reply's metadata can be used, else why not (it is rejected)."""
        return ""

    def accepts(self, arrival: Arrival) -> bool:
        """Whether an update this stale may be aggregated at all (else it is dropped)."""
        return self.max_staleness is None or arrival.staleness <= self.max_staleness

    def weight(self, arrival: Arrival) -> float:
        """The aggregation weight of an accepted update (default: ``s(staleness)``)."""
        return self.staleness(arrival.staleness)

    def contribution(
        self,
        update: Mapping[str, SparseTensor],
        arrival: Arrival,
        model: Mapping[str, torch.Tensor],
        start: Mapping[str, torch.Tensor] | None,
    ) -> Contribution:
        """What the buffer adds (times :meth:`weight`); default: the update itself.

        Parameters
        ----------
        update : mapping of str to SparseTensor
            The decoded, validated update (local model minus start model), read-only:
            returned as it is, it goes into the buffer without another check; anything
            else returned is checked once before it does.
        arrival : Arrival
            Its staleness and size.
        model : mapping of str to torch.Tensor
            The global model's trained tensors now.
        start : mapping of str to torch.Tensor or None
            The model the device started from (only with :attr:`needs_start_model`).
        """
        return update

    def describe(self) -> dict[str, Any]:
        """The strategy's numbers, for ``summary.json``."""
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "buffer_size": self.buffer_size,
            "staleness": self.staleness.spec(),
            "max_staleness": self.max_staleness,
            "normalization": self.mean,
            "decaying_compression": self.decaying_compression,
            "synchronous": self.synchronous,
        }
