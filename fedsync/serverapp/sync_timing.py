"""Simulated time of synchronous rounds, on the same fleet model as the async loop.

FedAvg runs Flower's own strategy unchanged; this object only *times* its rounds with
the :class:`~fedsync.clock.VirtualClock` the asynchronous loop uses, so both are measured
in the same simulated seconds from the same device profiles and real payload lengths.
A round starts when the previous one ended; each sampled device's task takes
``downlink / bandwidth + compute + uplink / bandwidth + latency`` (stretched over its
offline periods); the round ends when the last one arrives. A task the clock loses
(dropout, an offline period with ``offline_behavior = "drop"``) is left out of the
aggregation, as a synchronous server that never got that reply would have to; the
round then ends when the others are in (no extra timeout: the baseline is not tuned
down).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from flwr.serverapp import Grid

from fedsync.clock import Fleet, TaskWork, VirtualClock, load_fleet
from fedsync.clock.fleet import Assignment
from fedsync.serverapp.probe import device_order, probe_nodes


@dataclass
class RoundTiming:
    """How one synchronous round went in simulated time."""

    start: float
    end: float
    lost: set[int] = field(default_factory=set)


class SyncRoundClock:
    """Times synchronous rounds of sampled devices on a virtual clock.

    Parameters
    ----------
    fleet : str
        Fleet name or ``.toml`` path (``""``: uniform default devices).
    assignment : {"order", "random"}
        How fleet profiles are given to devices (by partition id order, or seeded).
    seed : int
        Seeds the assignment, availability phases and dropout draws.
    probe_timeout : float
        Real seconds to ask nodes for their partition id (their stable identity).
    """

    def __init__(
        self, fleet: str, *, assignment: str = "order", seed: int = 0, probe_timeout: float = 30.0
    ) -> None:
        self.spec = load_fleet(fleet)
        self.assignment = cast(Assignment, assignment)
        self.seed = seed
        self.probe_timeout = probe_timeout
        self.fleet: Fleet | None = None
        self.clock: VirtualClock | None = None
        self.device_of: dict[int, int] = {}
        self._round_start = 0.0
        self._started: dict[int, str] = {}
        self._lost_at_start: set[int] = set()

    def now(self) -> float:
        """Simulated seconds since the run began."""
        return self.clock.now() if self.clock is not None else 0.0

    def assign(self, grid: Grid, node_ids: list[int]) -> None:
        """Give every node a device profile (once; later nodes take the next device)."""
        if self.fleet is None:
            profiles = probe_nodes(grid, node_ids, timeout=self.probe_timeout)
            order = device_order(node_ids, profiles)
            self.device_of = {node: index for index, node in enumerate(order)}
            self.fleet = self.spec.assign(
                node_ids, how=self.assignment, seed=self.seed, key=self.device_of.__getitem__
            )
            self.clock = VirtualClock(self.fleet, seed=self.seed, key=self.device_of.__getitem__)
        for node in node_ids:
            if node not in self.device_of:
                self.device_of[node] = len(self.device_of)
                self.fleet.add(node)

    def start_round(self, server_round: int, downlink_bytes: Mapping[int, int]) -> None:
        """Dispatch one task per sampled node, all at the current simulated time."""
        assert self.clock is not None, "assign() first"
        self._round_start = self.clock.now()
        self._started.clear()
        self._lost_at_start.clear()
        for node, nbytes in sorted(downlink_bytes.items(), key=lambda kv: self.device_of[kv[0]]):
            task_id = f"{server_round}:{node}"
            self._started[node] = task_id
            if not self.clock.start(task_id, node, nbytes):
                self._lost_at_start.add(node)

    def finish_round(self, works: Mapping[int, TaskWork]) -> RoundTiming:
        """Feed the replies (node -> work done); nodes without one failed."""
        assert self.clock is not None, "assign() first"
        for node, task_id in self._started.items():
            if node in self._lost_at_start:
                continue
            if node in works:
                self.clock.reply(task_id, works[node])
            else:
                self.clock.error(task_id, "no reply")
        lost = set(self._lost_at_start)
        while (event := self.clock.pop()) is not None:
            if event.kind == "drop":
                lost.add(event.node_id)
        return RoundTiming(start=self._round_start, end=self.clock.now(), lost=lost)
