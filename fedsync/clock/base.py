"""The clock interface the asynchronous loop runs on, in simulation and in deployment.

The loop tells its clock what happens in the real world -- a device became idle, a task
was sent with so many bytes, a reply came back with so many bytes, a task failed -- and
asks it for the next :class:`ClockEvent` to act on. The clock decides *when* each
event happens and *in which order* the loop sees them:

* :class:`~fedsync.clock.wall.WallClock` (deployment): events happen when they happen.
* :class:`~fedsync.clock.virtual.VirtualClock` (simulation): events happen at simulated
  times computed from device profiles and real payload sizes, and are released in
  simulated-time order, however the real replies raced each other.

So the aggregation logic never knows which clock it runs on. What the loop keeps of a
task (its record, :class:`fedsync.engine.InFlight`) and what came back for it ride on
the task's events (:attr:`ClockEvent.task`, :attr:`ClockEvent.reply`): the clock holds
them from :meth:`Clock.start` and :meth:`Clock.reply` to the event, never reading them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Clock", "ClockEvent", "EventKind", "TaskWork"]

EventKind = Literal["wake", "reply", "error", "drop"]


@dataclass(frozen=True)
class TaskWork:
    """The work a finished task did, as the reply reports it.

    Parameters
    ----------
    uplink_bytes : int
        Length of the reply's payload.
    samples : int
        Training examples processed (steps times batch size, or examples times epochs).
    steps : int
        Optimizer steps taken.
    """

    uplink_bytes: int
    samples: int = 0
    steps: int = 0

    @classmethod
    def from_reply(
        cls, uplink_bytes: int, *, examples: int, steps: int, epochs: int, batch_size: int
    ) -> TaskWork:
        """The work a reply reports: ``examples`` in the partition, ``steps`` taken.

        Simulated compute needs the samples processed: steps x batch, capped by one
        pass over the data per epoch (the last batch of an epoch is short).
        """
        per_epochs = examples * epochs
        by_steps = steps * batch_size
        samples = min(per_epochs, by_steps) if per_epochs and by_steps else per_epochs or by_steps
        return cls(uplink_bytes=uplink_bytes, samples=samples, steps=steps)


@dataclass(frozen=True)
class ClockEvent:
    """Something the loop must act on, at a (simulated or wall) time.

    Attributes
    ----------
    kind : {"wake", "reply", "error", "drop"}
        ``wake``: an idle device applies for work. ``reply``: a task's reply may be
        processed. ``error``: a task failed (the loop said so). ``drop``: the clock lost
        the task (dropout, offline) -- its reply, if any, must be ignored.
    time : float
        Seconds since the clock started (simulated for the virtual clock).
    node_id : int
        The device.
    task_id : str
        The task (``""`` for ``wake``).
    seq : int
        Tie-breaker: events with equal times are released in ``seq`` order.
    reason : str
        Why, for ``error`` and ``drop``.
    timing : dict
        For ``reply``: the simulated breakdown (dispatch, downlink_s, compute_s,
        uplink_s, latency_s, waited_s).
    task : Any
        What the loop handed :meth:`Clock.start` with the task (its in-flight record);
        ``None`` for ``wake``, or when the loop gave nothing.
    reply : Any
        For ``reply``: what the loop handed :meth:`Clock.reply` (the device's reply).
    """

    kind: EventKind
    time: float
    node_id: int
    task_id: str = ""
    seq: int = 0
    reason: str = ""
    timing: dict[str, float] = field(default_factory=dict)
    task: Any = field(default=None, repr=False, compare=False)
    reply: Any = field(default=None, repr=False, compare=False)


class Clock(ABC):
    """What the asynchronous loop needs from time."""

    name: str = ""

    @abstractmethod
    def now(self) -> float:
        """Current time in seconds since start (simulated or wall)."""

    @abstractmethod
    def wake(self, node_id: int) -> None:
        """Device ``node_id`` is idle; emit a ``wake`` event when it can take work."""

    @abstractmethod
    def start(self, task_id: str, node_id: int, downlink_bytes: int, *, task: Any = None) -> bool:
        """A task is dispatched now with a downlink payload of ``downlink_bytes``;
        ``task`` (the loop's record of it) rides on the event that ends it.

        Returns
        -------
        bool
            True if the task must really be sent; False if the clock already knows it
            is lost (a ``drop`` event will follow; do not send it).
        """

    @abstractmethod
    def reply(self, task_id: str, work: TaskWork, *, reply: Any = None) -> None:
        """The real reply to ``task_id`` is in; schedule its ``reply`` event, carrying
        ``reply`` (or a ``drop``, which carries none)."""

    @abstractmethod
    def error(self, task_id: str, reason: str) -> None:
        """``task_id`` failed (error reply, failed push, TTL); schedule its ``error``."""

    @abstractmethod
    def pop(self) -> ClockEvent | None:
        """The next event whose turn has come, or None (wait for more replies)."""

    @property
    @abstractmethod
    def waiting(self) -> int:
        """Tasks started whose real outcome the clock still waits for."""

    @property
    @abstractmethod
    def queued(self) -> int:
        """Events scheduled but not yet popped."""

    def describe(self) -> dict[str, Any]:
        """What the clock is, for the run summary."""
        return {"clock": self.name}
