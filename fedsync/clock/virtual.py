"""The discrete-event virtual clock: simulated time from device profiles and real bytes.

Real ClientApps run in parallel in Flower's simulation engine and reply in whatever
order the host machine's scheduler happens to finish them. The virtual clock gives each
task the time it *would* have taken on its device,

``arrival = dispatch + downlink_bytes / downlink + compute + uplink_bytes / uplink + latency``

(stretched over offline periods, or cut short by them), using the real payload lengths,
and releases events to the loop strictly in simulated-time order.

The release rule. A task whose real reply has not come in yet still has a *lower bound*
on its simulated arrival: ``dispatch + downlink + compute_lb + latency`` (its upload
takes ``>= 0`` s; ``compute_lb`` is the least compute time the device has reported
before, 0 at first). The earliest known event at time ``T`` is released only when every
such outstanding task's lower bound is later than ``T`` (ties broken by dispatch order)
-- so a reply that came back early in real time waits for its simulated turn, and a
slow real reply holds back only the events that could come after it.

Randomness (each device's on/off phase, its dropout draws) comes from per-device
generators seeded by ``(seed, device key)``: the same seed and the same sequence of
calls give the same events, whatever the real timing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsync.clock.base import Clock, ClockEvent, EventKind, TaskWork
from fedsync.clock.fleet import Fleet
from fedsync.clock.profiles import DeviceProfile

__all__ = ["VirtualClock"]


@dataclass
class _Outstanding:
    """A task sent out whose real reply the clock still waits for."""

    node_id: int
    seq: int
    dispatch: float
    downlink_s: float
    lower_bound: float
    task: Any = None
    """The loop's record of the task, handed back on its event."""


class VirtualClock(Clock):
    """Simulated time, with arrivals released in simulated-time order.

    Parameters
    ----------
    profiles : Fleet or callable
        A :class:`~fedsync.clock.fleet.Fleet` or any ``node_id -> DeviceProfile``.
    seed : int
        Seeds each device's availability phase and dropout draws.
    key : callable, optional
        ``node_id -> int``, the device's stable identity in those seeds (default: the
        node id). Flower draws node ids at random in each simulation; keying by the
        partition id makes the draws repeat from run to run.
    """

    name = "virtual"

    def __init__(
        self,
        profiles: Fleet | Callable[[int], DeviceProfile],
        *,
        seed: int = 0,
        key: Callable[[int], int] | None = None,
    ) -> None:
        self._profile_for: Callable[[int], DeviceProfile] = (
            profiles.profile_for if isinstance(profiles, Fleet) else profiles
        )
        self.seed = seed
        self._key: Callable[[int], int] = key if key is not None else (lambda node_id: node_id)
        # --- simulated time and the event queue ---
        self._now = 0.0
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, ClockEvent]] = []
        self._outstanding: dict[str, _Outstanding] = {}
        # --- per-device state ---
        self._rngs: dict[int, np.random.Generator] = {}
        self._phases: dict[int, float] = {}
        self._compute_lb: dict[int, float] = {}

    # --- Clock interface ----------------------------------------------------------------
    def now(self) -> float:
        return self._now

    def wake(self, node_id: int) -> None:
        profile = self._profile_for(node_id)
        ready = profile.next_online(self._now, self._phase(node_id, profile))
        self._push("wake", ready, node_id, "", next(self._seq))

    def start(self, task_id: str, node_id: int, downlink_bytes: int, *, task: Any = None) -> bool:
        if task_id in self._outstanding:
            raise ValueError(f"task {task_id!r} already started")
        profile = self._profile_for(node_id)
        phase = self._phase(node_id, profile)
        seq = next(self._seq)
        downlink_s = profile.downlink_seconds(downlink_bytes)
        bound_work = downlink_s + self._compute_lb.get(node_id, 0.0) + profile.latency
        lower_bound, lost = profile.finish(self._now, bound_work, phase)
        # Draw on every task of a device with dropout, in dispatch order: the draws then
        # depend only on the seed and that device's task sequence.
        dropped = profile.dropout > 0.0 and self._rng(node_id).random() < profile.dropout
        if lost or dropped:
            reason = "offline" if lost else "dropout"
            self._push("drop", lower_bound, node_id, task_id, seq, reason, task=task)
            return False
        self._outstanding[task_id] = _Outstanding(
            node_id, seq, self._now, downlink_s, lower_bound, task
        )
        return True

    def reply(self, task_id: str, work: TaskWork, *, reply: Any = None) -> None:
        task = self._take(task_id)
        profile = self._profile_for(task.node_id)
        compute_s = profile.compute_seconds(work.samples, work.steps)
        uplink_s = profile.uplink_seconds(work.uplink_bytes)
        previous = self._compute_lb.get(task.node_id)
        self._compute_lb[task.node_id] = compute_s if previous is None else min(previous, compute_s)
        busy = task.downlink_s + compute_s + uplink_s + profile.latency
        end, lost = profile.finish(task.dispatch, busy, self._phase(task.node_id, profile))
        # The lower bound assumed at least the device's least compute time so far; if
        # this task did less work, keep the promise made to the release rule (the
        # difference only exists when a device's workload shrinks).
        end = max(end, task.lower_bound)
        if lost:
            self._push("drop", end, task.node_id, task_id, task.seq, "offline", task=task.task)
            return
        timing = {
            "dispatch": task.dispatch,
            "downlink_s": task.downlink_s,
            "compute_s": compute_s,
            "uplink_s": uplink_s,
            "latency_s": profile.latency,
            "waited_s": max(0.0, end - task.dispatch - busy),
        }
        node_id, seq = task.node_id, task.seq
        self._push("reply", end, node_id, task_id, seq, timing=timing, task=task.task, reply=reply)

    def error(self, task_id: str, reason: str) -> None:
        task = self._take(task_id)
        # Simulated time of a failure: the earliest the server could have learnt of it.
        self._push(
            "error", task.lower_bound, task.node_id, task_id, task.seq, reason, task=task.task
        )

    def pop(self) -> ClockEvent | None:
        if not self._heap:
            return None
        time, seq, event = self._heap[0]
        for task in self._outstanding.values():
            if (task.lower_bound, task.seq) <= (time, seq):
                return None  # that task might still arrive first
        heapq.heappop(self._heap)
        self._now = max(self._now, time)
        return event

    @property
    def waiting(self) -> int:
        return len(self._outstanding)

    @property
    def queued(self) -> int:
        return len(self._heap)

    def describe(self) -> dict[str, object]:
        return {"clock": self.name, "seed": self.seed}

    def phase_of(self, node_id: int) -> float:
        """The device's position in its on/off cycle at time 0 (0 if always online)."""
        return self._phase(node_id, self._profile_for(node_id))

    # --- helpers --------------------------------------------------------------------------
    def _push(
        self,
        kind: EventKind,
        time: float,
        node_id: int,
        task_id: str,
        seq: int,
        reason: str = "",
        timing: dict[str, float] | None = None,
        *,
        task: Any = None,
        reply: Any = None,
    ) -> None:
        event = ClockEvent(kind, time, node_id, task_id, seq, reason, timing or {}, task, reply)
        heapq.heappush(self._heap, (time, seq, event))

    def _take(self, task_id: str) -> _Outstanding:
        try:
            return self._outstanding.pop(task_id)
        except KeyError:
            raise ValueError(f"task {task_id!r} is not outstanding") from None

    def _rng(self, node_id: int) -> np.random.Generator:
        rng = self._rngs.get(node_id)
        if rng is None:
            # SeedSequence takes any non-negative integers: node ids are uint64.
            identity = self._key(node_id) & (2**64 - 1)
            rng = np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, identity])
            self._rngs[node_id] = rng
        return rng

    def _phase(self, node_id: int, profile: DeviceProfile) -> float:
        if not profile.intermittent:
            return 0.0
        phase = self._phases.get(node_id)
        if phase is None:
            phase = float(self._rng(node_id).uniform(0.0, profile.period))
            self._phases[node_id] = phase
        return phase
