"""Which device gets work next: apply-for-work queue, concurrency cap, bounded retries.

TEASQ-Fed's devices *apply* for a task whenever they are idle; the server grants
applications first come, first served while fewer than ``C`` tasks are in flight. The
scheduler keeps that bookkeeping and nothing else -- it knows devices by node id and
has no notion of time, messages or models:

::

    idle --apply()--> ready --next_device()--> busy --finish() / lose()--> idle
                                                 \\--fail()--> idle (retry) | retired
    retired --readmit()--> idle   (a device that had left is back)

A device whose task fails ``max_retries + 1`` times in a row (error reply, TTL expired,
node unavailable, rejected payload) is retired: it gets no more work, and once every
device is retired :attr:`TaskScheduler.exhausted` tells the loop to end rather than
wait for replies that will never come.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["DeviceState", "DeviceStats", "SchedulerError", "TaskScheduler"]


class SchedulerError(RuntimeError):
    """A transition the device's state does not allow (a bookkeeping bug)."""


class DeviceState(Enum):
    """Where a device is in its task cycle."""

    IDLE = "idle"
    """Between tasks, not (yet) applying (e.g. offline in simulation)."""
    READY = "ready"
    """Applied for work, waiting for a slot."""
    BUSY = "busy"
    """Holds a task in flight."""
    RETIRED = "retired"
    """Failed too often; gets no more work."""


@dataclass
class DeviceStats:
    """Per-device counters, reported in the run summary."""

    state: DeviceState = DeviceState.IDLE
    tasks: int = 0
    completed: int = 0
    failures: int = 0
    lost: int = 0
    consecutive_failures: int = 0
    last_failure: str = ""
    task_seconds: list[float] = field(default_factory=list)
    """Clock seconds from dispatch to reply of each replied task (wall seconds on a
    deployment, simulated seconds in a simulation)."""
    compute_seconds: list[float] = field(default_factory=list)
    """Wall seconds each replied task trained, as the device measured them."""


class TaskScheduler:
    """First-come-first-served work queue with a concurrency cap and retry budget.

    Parameters
    ----------
    node_ids : iterable of int
        The devices known at the start (more may :meth:`join` later).
    concurrency : int
        ``C``: most devices busy at once, ``>= 1``.
    max_retries : int
        Consecutive failed tasks a device may retry after, ``>= 0``; one more failure
        retires it. A completed task resets the count.
    """

    def __init__(self, node_ids: Iterable[int], *, concurrency: int, max_retries: int = 3) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ValueError(f"max-retries must be >= 0, got {max_retries}")
        self.concurrency = concurrency
        self.max_retries = max_retries
        # --- per-device bookkeeping ---
        self.devices: dict[int, DeviceStats] = {}
        self._ready: deque[int] = deque()
        self._busy: set[int] = set()
        for node_id in node_ids:
            self.join(node_id)

    # --- membership -------------------------------------------------------------------
    def join(self, node_id: int) -> bool:
        """Register a device (idle); returns False if it was already known."""
        if node_id in self.devices:
            return False
        self.devices[node_id] = DeviceStats()
        return True

    # --- queries ------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Devices holding a task."""
        return len(self._busy)

    @property
    def ready(self) -> tuple[int, ...]:
        """Devices waiting for work, in application order."""
        return tuple(self._ready)

    @property
    def active(self) -> int:
        """Devices not retired."""
        return sum(stats.state is not DeviceState.RETIRED for stats in self.devices.values())

    @property
    def exhausted(self) -> bool:
        """True when no device can ever get work again (all retired, or none known)."""
        return self.active == 0

    def state(self, node_id: int) -> DeviceState:
        """A device's current state."""
        return self._stats(node_id).state

    @property
    def retired(self) -> list[int]:
        """Retired devices, by node id."""
        return sorted(n for n, s in self.devices.items() if s.state is DeviceState.RETIRED)

    # --- transitions --------------------------------------------------------------------
    def apply(self, node_id: int) -> None:
        """An idle device applies for work (joins the back of the queue)."""
        stats = self._stats(node_id)
        if stats.state is DeviceState.RETIRED:
            return  # a late wake-up of a retired device: nothing to do
        if stats.state is not DeviceState.IDLE:
            raise SchedulerError(f"node {node_id} applied for work while {stats.state.value}")
        stats.state = DeviceState.READY
        self._ready.append(node_id)

    def next_device(self) -> int | None:
        """Grant the oldest application if a slot is free; the device becomes busy.

        Returns
        -------
        int or None
            The node to send a task to, or ``None`` if all ``C`` slots are taken or no
            device is waiting.
        """
        if len(self._busy) >= self.concurrency or not self._ready:
            return None
        node_id = self._ready.popleft()
        stats = self.devices[node_id]
        stats.state = DeviceState.BUSY
        stats.tasks += 1
        self._busy.add(node_id)
        return node_id

    def finish(self, node_id: int) -> None:
        """The device's task ended with a usable reply (aggregated or dropped as stale)."""
        stats = self._release(node_id)
        stats.completed += 1
        stats.consecutive_failures = 0
        stats.state = DeviceState.IDLE

    def timed(self, node_id: int, task_seconds: float, compute_seconds: float | None) -> None:
        """Record how long one of the device's tasks took (reply to dispatch) and trained."""
        stats = self._stats(node_id)
        stats.task_seconds.append(float(task_seconds))
        if compute_seconds is not None:
            stats.compute_seconds.append(float(compute_seconds))

    def fail(self, node_id: int, reason: str) -> bool:
        """The device's task failed; returns True if the device is now retired.

        Parameters
        ----------
        node_id : int
            The busy device.
        reason : str
            Why (kept in the device's stats for the summary).
        """
        stats = self._release(node_id)
        stats.failures += 1
        stats.consecutive_failures += 1
        stats.last_failure = reason
        if stats.consecutive_failures > self.max_retries:
            stats.state = DeviceState.RETIRED
            return True
        stats.state = DeviceState.IDLE
        return False

    def lose(self, node_id: int) -> None:
        """The task was lost to simulated availability (dropout, offline): neither a
        success nor the device's fault, so the retry budget is left alone."""
        stats = self._release(node_id)
        stats.lost += 1
        stats.state = DeviceState.IDLE

    def retire(self, node_id: int, reason: str) -> None:
        """Take a device out for good (it left the federation)."""
        stats = self._stats(node_id)
        if stats.state is DeviceState.BUSY:
            self._busy.discard(node_id)
        if stats.state is DeviceState.READY:
            self._ready.remove(node_id)
        stats.state = DeviceState.RETIRED
        stats.last_failure = reason

    def readmit(self, node_id: int, failures: tuple[str, ...]) -> bool:
        """Take a retired device back if its last failure starts with one of ``failures``
        (it had left and is back); returns whether it was taken back (now idle)."""
        stats = self._stats(node_id)
        if stats.state is not DeviceState.RETIRED or not stats.last_failure.startswith(failures):
            return False
        stats.state = DeviceState.IDLE
        stats.consecutive_failures = 0
        return True

    def summary(self) -> dict[str, dict[str, int | str | float | None]]:
        """Per-device counters and median task times, by node id (as strings, for JSON)."""
        return {
            str(node_id): {
                "state": stats.state.value,
                "tasks": stats.tasks,
                "completed": stats.completed,
                "failures": stats.failures,
                "lost": stats.lost,
                "last_failure": stats.last_failure,
                "task_seconds_median": _median(stats.task_seconds),
                "compute_seconds_median": _median(stats.compute_seconds),
            }
            for node_id, stats in sorted(self.devices.items())
        }

    # --- helpers ------------------------------------------------------------------------
    def _stats(self, node_id: int) -> DeviceStats:
        try:
            return self.devices[node_id]
        except KeyError:
            raise SchedulerError(f"unknown node {node_id}") from None

    def _release(self, node_id: int) -> DeviceStats:
        stats = self._stats(node_id)
        if stats.state is not DeviceState.BUSY:
            raise SchedulerError(f"node {node_id} has no task in flight ({stats.state.value})")
        self._busy.discard(node_id)
        return stats


def _median(values: list[float]) -> float | None:
    """The median, rounded for the summary (``None`` for no values)."""
    return round(statistics.median(values), 6) if values else None
