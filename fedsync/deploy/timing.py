"""Where a deployed task's time goes: the server's event log joined with SuperNode logs.

The ServerApp's event log (``events.jsonl``, wall clock) gives each task's dispatch,
its arrival and round trip (``sim_duration``), its bytes and the ClientApp's own
training time (``wall_compute_s``). A SuperNode started with timestamped logs
(:func:`fedsync.deploy.processes.start_process`) adds when it pulled the message
(``Receiving``), had all of it (``Received successfully``), began sending the reply
(``Sending``) and was done (``Sent successfully``). Together::

    round trip = outside + download + clientapp + upload
    outside    = the SuperNode's polling wait (it asks every ~3 s) + the server's pull lag
    download   = pulling the message's objects over the link (``Receiving`` -> ``Received``)
    clientapp  = a fresh ``flwr-clientapp`` process: start, imports, data, *training*,
                 encoding, and the SuperNode's 0.5 s wait for the reply
    upload     = pushing the reply over the link (``Sending`` -> ``Sent``)

The ClientApp may start before ``Received successfully``: Flower stores the message
before it pulls the objects, and confirms the receipt over the link only after the last
one is in. A warm executor (``fedsync-node``) takes the task as soon as the objects are
in the node's store, so a short task can be done before the confirmation returns; the
SuperNode then finds the reply at once and ``clientapp`` is (about) zero, its time
hidden in ``download``. The log's times are when the relay read each line, so on a busy
machine they can also lag by a fraction of a second: the phases are exact to that
resolution, and a phase shorter than it can read zero.

A SuperNode handles one message at a time, so its k-th train message is the k-th task
dispatched to it (the server sends each device one task at a time).

``outside`` splits further when the SuperLink's log is given: ``poll_wait`` is from
the dispatch to the SuperNode's ``Receiving``, ``pull_lag`` from its ``Sent`` to the
server's arrival. The server's clock (``wall_time``, seconds since the run started) is
joined to Unix time by the SuperLink's access log, which stamps every ``push-messages``
call: the server pushes one per dispatch, so the last ``n`` pushes are the ``n``
dispatches (:func:`server_clock_offset`). A long pull lag is the server not taking the
reply yet: Flower 1.39 announces a reply while its node is still uploading it, and the
ServerApp's pull of its objects retries until they are all in. Flower's own ServerApp
pulls one reply after another, so a slow upload also held the replies of other nodes;
fedsync's asynchronous server pulls them concurrently (``fedsync.serverapp.reply_pulls``).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedsync.deploy.processes import read_timestamped_log
from fedsync.reports import read_events

__all__ = [
    "NodeMessage",
    "TaskTiming",
    "parse_supernode_log",
    "server_clock_offset",
    "summarize",
    "summarize_by_node",
    "task_timings",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE_ID = re.compile(r"SuperNode ID: (\d+)")
_RECEIVING = re.compile(r"Receiving: (\w+) message")
_SENDING = re.compile(r"Sending: (\w+) message")
_PUSH = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z .*\"POST /v1/runtime/push-messages "
)
_JOIN_SPREAD_S = 0.5
"""Pushes and dispatches that disagree by more than this are not one per dispatch."""


@dataclass
class NodeMessage:
    """One message as a SuperNode handled it (Unix times from its timestamped log)."""

    kind: str
    receiving: float
    received: float | None = None
    sending: float | None = None
    sent: float | None = None

    @property
    def complete(self) -> bool:
        """Whether all four moments were logged."""
        return None not in (self.received, self.sending, self.sent)


def parse_supernode_log(path: Path) -> tuple[int | None, list[NodeMessage]]:
    """The node id and the messages of one SuperNode's timestamped log, in order."""
    node_id: int | None = None
    messages: list[NodeMessage] = []
    for when, raw in read_timestamped_log(path):
        line = _ANSI.sub("", raw)
        if (match := _NODE_ID.search(line)) is not None:
            node_id = int(match.group(1))
        elif (match := _RECEIVING.search(line)) is not None:
            messages.append(NodeMessage(match.group(1), when))
        elif messages and "Received successfully" in line:
            messages[-1].received = when
        elif messages and _SENDING.search(line) is not None:
            messages[-1].sending = when
        elif messages and "Sent successfully" in line:
            messages[-1].sent = when
    return node_id, messages


@dataclass(frozen=True)
class TaskTiming:
    """One completed task, its time split into phases (seconds) and its bytes."""

    task: str
    node_index: int
    node_id: int
    round_trip_s: float
    outside_s: float
    download_s: float
    clientapp_s: float
    compute_s: float
    upload_s: float
    bytes_down: int
    bytes_up: int
    examples: int = 0
    """The node's training examples (``num-examples`` of the reply)."""
    pull_lag_s: float | None = None
    """Part of ``outside_s`` from the SuperNode's ``Sent`` to the server's arrival
    (``None``: the event log has no server times)."""

    @property
    def poll_wait_s(self) -> float | None:
        """Part of ``outside_s`` from dispatch to the SuperNode's ``Receiving``."""
        return None if self.pull_lag_s is None else self.outside_s - self.pull_lag_s

    @property
    def clientapp_overhead_s(self) -> float:
        """ClientApp time that is not training: process start, imports, data, codec."""
        return self.clientapp_s - self.compute_s

    def as_dict(self) -> dict[str, Any]:
        """For a JSON report (rounded to milliseconds)."""
        return {
            "task": self.task,
            "node_index": self.node_index,
            "node_id": self.node_id,
            "round_trip_s": round(self.round_trip_s, 3),
            "outside_s": round(self.outside_s, 3),
            "download_s": round(self.download_s, 3),
            "clientapp_s": round(self.clientapp_s, 3),
            "compute_s": round(self.compute_s, 3),
            "clientapp_overhead_s": round(self.clientapp_overhead_s, 3),
            "upload_s": round(self.upload_s, 3),
            "poll_wait_s": _round(self.poll_wait_s),
            "pull_lag_s": _round(self.pull_lag_s),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "examples": self.examples,
        }


def server_clock_offset(
    superlink_log: Path, events: Sequence[Mapping[str, object]]
) -> float | None:
    """Unix time minus the event log's ``wall_time``, from the SuperLink's access log.

    The last ``n`` ``push-messages`` requests the SuperLink logged are paired with the
    ``n`` dispatch events; the offset is the median difference. ``None`` when the log or
    the times are missing, or the pairs disagree by more than 0.5 s (the server did not
    push one request per dispatch).
    """
    if not superlink_log.is_file():
        return None
    pushes = []
    for line in superlink_log.read_text(encoding="utf-8", errors="replace").splitlines():
        if (match := _PUSH.match(line)) is not None:
            pushes.append(datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC).timestamp())
    dispatches = [
        float(str(e["wall_time"]))
        for e in events
        if e.get("event") == "dispatch" and e.get("wall_time") is not None
    ]
    if not dispatches or len(pushes) < len(dispatches):
        return None
    diffs = [p - d for p, d in zip(pushes[-len(dispatches) :], dispatches, strict=True)]
    if max(diffs) - min(diffs) > _JOIN_SPREAD_S:
        return None
    return statistics.median(diffs)


def task_timings(
    events_path: Path, supernode_logs: Sequence[Path], superlink_log: Path | None = None
) -> list[TaskTiming]:
    """Join the event log with SuperNode ``i``'s log (``supernode_logs[i]``).

    With ``superlink_log`` (the SuperLink's timestamped access log) each task's
    ``outside`` is split into poll wait and pull lag (module docstring).

    Tasks that did not arrive (errors, drops) and messages whose phases are not all
    logged are left out.
    """
    events = list(read_events(events_path))
    offset = None if superlink_log is None else server_clock_offset(superlink_log, events)
    dispatched: dict[int, list[str]] = {}
    for event in events:
        if event["event"] == "dispatch":
            dispatched.setdefault(int(event["node"]), []).append(str(event["task"]))
    arrivals = {str(e["task"]): e for e in events if e["event"] == "arrival"}
    timings: list[TaskTiming] = []
    for index, log_path in enumerate(supernode_logs):
        node_id, messages = parse_supernode_log(log_path)
        if node_id is None:
            continue
        trains = [m for m in messages if m.kind == "train"]
        for task_id, message in zip(dispatched.get(node_id, []), trains, strict=False):
            arrival = arrivals.get(task_id)
            if arrival is None or not message.complete:
                continue
            assert message.received is not None and message.sending is not None
            assert message.sent is not None
            round_trip = float(arrival["sim_duration"])
            busy = message.sent - message.receiving
            wall = arrival.get("wall_time")
            pull_lag = (
                None if offset is None or wall is None else float(wall) + offset - message.sent
            )
            timings.append(
                TaskTiming(
                    task=task_id,
                    node_index=index,
                    node_id=node_id,
                    round_trip_s=round_trip,
                    outside_s=round_trip - busy,
                    download_s=message.received - message.receiving,
                    clientapp_s=message.sending - message.received,
                    compute_s=float(arrival.get("wall_compute_s") or 0.0),
                    upload_s=message.sent - message.sending,
                    bytes_down=int(arrival["bytes_down"]),
                    bytes_up=int(arrival["bytes_up"]),
                    examples=int(arrival.get("num_examples") or 0),
                    pull_lag_s=pull_lag,
                )
            )
    return timings


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_PHASES = (
    "round_trip_s",
    "outside_s",
    "download_s",
    "clientapp_s",
    "compute_s",
    "clientapp_overhead_s",
    "upload_s",
    "poll_wait_s",
    "pull_lag_s",
)


def summarize(timings: Iterable[TaskTiming]) -> dict[str, Any]:
    """Per phase: mean, median, min and max over the tasks; plus counts and bytes."""
    rows = [t.as_dict() for t in timings]
    if not rows:
        return {"tasks": 0}
    summary: dict[str, Any] = {
        "tasks": len(rows),
        "bytes_down": sum(r["bytes_down"] for r in rows),
        "bytes_up": sum(r["bytes_up"] for r in rows),
    }
    for phase in _PHASES:
        values = [float(r[phase]) for r in rows if r[phase] is not None]
        if not values:
            continue
        summary[phase] = {
            "mean": round(statistics.fmean(values), 3),
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
        }
    return summary


def summarize_by_node(timings: Sequence[TaskTiming]) -> dict[int, dict[str, Any]]:
    """:func:`summarize` per SuperNode index."""
    grouped: dict[int, list[TaskTiming]] = {}
    for timing in timings:
        grouped.setdefault(timing.node_index, []).append(timing)
    return {index: summarize(rows) for index, rows in sorted(grouped.items())}
