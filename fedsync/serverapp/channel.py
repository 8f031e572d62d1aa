"""The asynchronous server's channel to the nodes, over Flower's Grid Message API.

The one place that talks to the Grid for the asynchronous strategies: push a task,
pull replies without blocking, notice replies that never come (TTL), know which nodes
exist and which are online, and ask each node who it is (the partition probe). Nothing
here decides what a task carries or what a reply means: the records are built and read
by :mod:`fedsync.protocol`, the decisions are the engine's and the loop's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import WARNING

from flwr.app import Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync.protocol import NodeProfile, TrainReply, TrainTask
from fedsync.serverapp.probe import probe_nodes
from fedsync.serverapp.reply_pulls import PulledReply, ReplyPulls, SerialPulls, concurrent_pulls

__all__ = ["ERROR_NAMES", "Delivery", "GridChannel"]

ERROR_NAMES = {
    1: "load-clientapp-exception",
    2: "clientapp-exception",
    3: "ttl-expired",
    4: "reply-expired",
    5: "node-unavailable",
    8: "clientapp-crashed",
}
"""Error codes Flower 1.39 sets on replies, by the name the run's counters use."""

TTL_GRACE_S = 10.0
"""Extra real seconds past a task's TTL before the channel stops waiting for its reply
(Flower normally answers an expired task with error code 3 itself)."""


@dataclass(frozen=True)
class Delivery:
    """What came back for one task: a reply, or an error (``"<kind> (code N): ..."``)."""

    task_id: str
    reply: TrainReply | None = None
    error: str = ""


class GridChannel:
    """Push tasks, pull replies, watch TTLs and nodes, over one Flower Grid.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The ServerApp's Grid.
    task_ttl : float
        Flower TTL of every task message, in seconds.
    poll_interval : float
        Real seconds between pulls of the probe when nothing came in.
    sleep : callable
        How to wait (tests pass a no-op).

    Notes
    -----
    Over Flower's HTTP Grid (a deployment) replies are pulled concurrently
    (:mod:`fedsync.serverapp.reply_pulls`): a reply is delivered as soon as its own objects are in,
    not after the uploads of the replies ahead of it, and :meth:`poll` never waits for
    an upload. Any other Grid (the simulation's in-memory one) keeps its own
    ``pull_messages`` (:class:`~fedsync.serverapp.reply_pulls.SerialPulls`). :meth:`close` ends the
    pulls' threads.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        task_ttl: float,
        poll_interval: float = 0.05,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.grid = grid
        self.task_ttl = task_ttl
        self.poll_interval = poll_interval
        self.sleep = sleep
        self._awaited: dict[str, tuple[str, float]] = {}
        """Message id -> task id and real (monotonic) push time, for every message whose
        reply is still awaited, in push order."""
        self._pulls: ReplyPulls | SerialPulls = concurrent_pulls(
            grid, retry_from=poll_interval
        ) or SerialPulls(grid)

    # --- nodes --------------------------------------------------------------------------------
    def node_ids(self) -> list[int]:
        """The connected nodes, sorted."""
        return sorted(int(n) for n in self.grid.get_node_ids())

    def online(self, node_id: int) -> bool:
        """Whether the SuperLink lists the node (a flaky connection: assume it is)."""
        try:
            return node_id in set(self.node_ids())
        except Exception:  # a flaky SuperLink connection: assume nothing
            return True

    def wait_for_nodes(self, minimum: int, timeout: float) -> list[int]:
        """Wait up to ``timeout`` real seconds for ``minimum`` nodes; at least one.

        Raises
        ------
        RuntimeError
            If no node connected at all.
        """
        deadline = time.monotonic() + timeout
        while True:
            node_ids = self.node_ids()
            if len(node_ids) >= minimum:
                return node_ids
            if time.monotonic() >= deadline:
                if node_ids:
                    log(WARNING, "[fedsync] only %d of %d nodes; starting", len(node_ids), minimum)
                    return node_ids
                raise RuntimeError(f"no SuperNode connected within node-wait={timeout} s")
            self.sleep(1.0)

    def probe(self, node_ids: list[int], timeout: float) -> dict[int, NodeProfile]:
        """Ask every node who it is (see :func:`fedsync.serverapp.probe.probe_nodes`)."""
        return probe_nodes(
            self.grid, node_ids, timeout=timeout, poll_interval=self.poll_interval, sleep=self.sleep
        )

    # --- tasks --------------------------------------------------------------------------------
    @property
    def awaited(self) -> int:
        """Messages whose reply is still awaited."""
        return len(self._awaited)

    def send(self, task_id: str, node_id: int, task: TrainTask, *, group: str) -> str:
        """Push one TRAIN message; ``""`` on success, else why it failed (``push-failed: ...``)."""
        message = Message(
            task.to_record(),
            dst_node_id=node_id,
            message_type=MessageType.TRAIN,
            ttl=self.task_ttl,
            group_id=group,
        )
        try:
            message_ids = [str(mid) for mid in self.grid.push_messages([message])]
            failure = "push-failed: push_messages returned no message id"
        except Exception as err:  # a dead SuperLink connection must not end the run
            message_ids, failure = [], f"push-failed: {type(err).__name__}: {err}"
        if not message_ids or not message_ids[0]:
            return failure
        self._awaited[message_ids[0]] = (task_id, time.monotonic())
        return ""

    def poll(self) -> list[Delivery]:
        """Pull the replies that are in (never blocks); one delivery per answered task."""
        if not self._awaited:
            return []
        deliveries = []
        for reply in self._pulls.pull(list(self._awaited)):
            awaited = self._awaited.pop(reply.message_id, None)
            if awaited is None:
                continue  # a reply we stopped waiting for (TTL guard) or a duplicate
            deliveries.append(_delivery(awaited[0], reply))
        return deliveries

    def overdue(self) -> list[Delivery]:
        """Stop waiting for replies well past their TTL (Flower should have said so).

        That includes a reply the SuperLink has handed out whose objects are still being
        pulled (a node that died mid-upload would hold its pull for Flower's 2 h limit):
        the pull is stopped, and a reply that completes anyway is ignored.
        """
        now = time.monotonic()
        late = [m for m, (_, at) in self._awaited.items() if now - at > self.task_ttl + TTL_GRACE_S]
        self._pulls.forget(late)
        deliveries = []
        for message_id in late:
            task_id, _ = self._awaited.pop(message_id)
            deliveries.append(
                Delivery(task_id, error="ttl-expired: no reply from Flower past the TTL")
            )
        return deliveries

    def close(self) -> None:
        """End the reply pulls in flight and their threads (the run is over)."""
        self._pulls.close()


def _delivery(task_id: str, pulled: PulledReply) -> Delivery:
    """The delivery of one pulled reply: its record, or its error by :data:`ERROR_NAMES`."""
    reply = pulled.message
    if reply is None:
        if not pulled.code:
            return Delivery(task_id, error=f"pull-failed: {pulled.reason}")
        return Delivery(task_id, error=_error(pulled.code, pulled.reason))
    if reply.has_error():
        return Delivery(task_id, error=_error(int(reply.error.code), reply.error.reason))
    return Delivery(task_id, reply=TrainReply.from_record(reply.content))


def _error(code: int, reason: str | None) -> str:
    name = ERROR_NAMES.get(code, "error")
    return f"{name} (code {code}): {reason or ''}".strip()
