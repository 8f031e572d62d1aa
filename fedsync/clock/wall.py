"""The wall clock: deployment time, events in the order they really happen."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fedsync.clock.base import Clock, ClockEvent, EventKind, TaskWork

__all__ = ["WallClock"]


class WallClock(Clock):
    """Real time since construction; every event is released as soon as it is known.

    Real devices bring their own speed, links and availability, so there is nothing
    to simulate: a device applies for work the moment it is idle, and replies are
    handled in the order they are pulled.

    Parameters
    ----------
    time_fn : callable
        The time source (``time.monotonic``; tests pass a fake).
    """

    name = "wall"

    def __init__(self, *, time_fn: Callable[[], float] = time.monotonic) -> None:
        self._time_fn = time_fn
        self._t0 = time_fn()
        self._seq = 0
        self._events: deque[ClockEvent] = deque()
        self._outstanding: dict[str, tuple[int, float, Any]] = {}
        """Task id -> its device, dispatch time and the loop's record of it."""

    def now(self) -> float:
        return self._time_fn() - self._t0

    def wake(self, node_id: int) -> None:
        self._push("wake", node_id, "")

    def start(self, task_id: str, node_id: int, downlink_bytes: int, *, task: Any = None) -> bool:
        if task_id in self._outstanding:
            raise ValueError(f"task {task_id!r} already started")
        self._seq += 1
        self._outstanding[task_id] = (node_id, self.now(), task)
        return True

    def reply(self, task_id: str, work: TaskWork, *, reply: Any = None) -> None:
        node_id, dispatch, task = self._take(task_id)
        now = self.now()
        timing = {"dispatch": dispatch, "round_trip_s": now - dispatch}
        self._push("reply", node_id, task_id, timing=timing, task=task, reply=reply)

    def error(self, task_id: str, reason: str) -> None:
        node_id, _, task = self._take(task_id)
        self._push("error", node_id, task_id, reason, task=task)

    def pop(self) -> ClockEvent | None:
        return self._events.popleft() if self._events else None

    @property
    def waiting(self) -> int:
        return len(self._outstanding)

    @property
    def queued(self) -> int:
        return len(self._events)

    def _push(
        self,
        kind: EventKind,
        node_id: int,
        task_id: str,
        reason: str = "",
        timing: dict[str, float] | None = None,
        *,
        task: Any = None,
        reply: Any = None,
    ) -> None:
        self._seq += 1
        self._events.append(
            ClockEvent(
                kind, self.now(), node_id, task_id, self._seq, reason, timing or {}, task, reply
            )
        )

    def _take(self, task_id: str) -> tuple[int, float, Any]:
        try:
            return self._outstanding.pop(task_id)
        except KeyError:
            raise ValueError(f"task {task_id!r} is not outstanding") from None
