"""A node that left and came back under the same node id gets work again.

With SuperNode authentication a restarted node keeps its id (the node id is fixed when
its public key is registered on the SuperLink), so the loop's wall-clock refresh
cannot tell it by a new id: it takes back a device it gave up for being *gone*
(node-unavailable, failed pushes) once the device is online again. A device given up
for bad replies while online stays out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import Error, Message, MessageType

import fedsync.serverapp.loop as async_run
from fedsync.config import RunConfig
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.run import run_async
from tests.unit.test_async_run import (
    DenseCodec,
    FakeClients,
    FakeGrid,
    initial_state,
    make_evaluate,
    task_identity,  # noqa: F401  (autouse: Flower's task identity for Message())
)


class Restarting(FakeClients):
    """Node 3 is down for its first tasks (Flower answers code 5), then back."""

    def __init__(self, down_for: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down_for = down_for
        self.failed = 0

    def __call__(self, message: Message) -> Message | None:
        train = message.metadata.message_type == MessageType.TRAIN
        if message.metadata.dst_node_id == 3 and train and self.failed < self.down_for:
            self.failed += 1
            return Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=message)
        return super().__call__(message)


def _run_fedbuff(
    grid: FakeGrid, nodes: list[int], folder: Path, *, aggregations: int, retries: int
) -> tuple[Any, list[dict[str, Any]]]:
    """FedBuff (C = 3, K = 2) on the wall clock over ``grid``: the result and its events."""
    recorder = RunRecorder(folder, "rejoin")
    result = run_async(
        grid,  # type: ignore[arg-type]
        RunConfig.of(
            strategy="fedbuff",
            concurrency=3,
            buffer_size=2,
            max_aggregations=aggregations,
            max_retries=retries,
            clock="wall",
            probe_timeout=0.0,
            uplink_codec="x",
            downlink_codec="x",
            plots=False,
        ),
        recorder=recorder,
        global_state=initial_state(),
        evaluate_fn=make_evaluate(nodes),
        codec_factory=DenseCodec,
        sleep=lambda _: None,
    )
    recorder.close()
    return result, list(read_events(recorder.events_path))


def test_a_node_given_up_for_leaving_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(async_run, "NODE_REFRESH_S", 0.0)
    nodes = [1, 2, 3, 4]
    clients = Restarting(down_for=3, behaviour={4: "garbage"})
    result, events = _run_fedbuff(
        FakeGrid(nodes, clients), nodes, tmp_path, aggregations=12, retries=2
    )
    kinds = [(e["event"], e.get("node")) for e in events]
    gave_up = kinds.index(("give-up", 3))
    returned = kinds.index(("node-returned", 3))
    assert gave_up < returned
    assert any(kind == ("arrival", 3) for kind in kinds[returned:])
    devices = result.summary["devices"]
    assert devices["3"]["state"] != "retired" and devices["3"]["completed"] > 0
    # Given up for garbage while online: never taken back.
    assert devices["4"]["state"] == "retired" and ("node-returned", 4) not in kinds
    assert result.summary["errors"] == {"node-unavailable": 3}
    assert result.version == 12


class OfflineGrid(FakeGrid):
    """Node 3 goes offline for a while (not in ``get_node_ids``; code 5 replies)."""

    offline = range(3, 12)  # in polls of the grid

    def get_node_ids(self) -> list[int]:
        return [n for n in self.node_ids if n != 3 or self.polls not in self.offline]

    def push_messages(self, messages: Any) -> list[str]:
        out = []
        for message in messages:
            down = message.metadata.dst_node_id == 3 and self.polls in self.offline
            if down and message.metadata.message_type == MessageType.TRAIN:
                self.counter += 1
                message_id = f"msg-{self.counter}"
                message.metadata.__dict__["_message_id"] = message_id
                error = Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=message)
                self.pending[message_id] = (self.polls, error)
                out.append(message_id)
            else:
                out += super().push_messages([message])
        return out


def test_a_node_flower_reports_offline_is_given_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No retries into a node the SuperLink has marked offline: they would only hold
    concurrency slots. It is taken back once it is online again."""
    monkeypatch.setattr(async_run, "NODE_REFRESH_S", 0.0)
    nodes = [1, 2, 3]
    result, events = _run_fedbuff(
        OfflineGrid(nodes, FakeClients()), nodes, tmp_path, aggregations=16, retries=3
    )
    [error] = [e for e in events if e["event"] == "error"]
    assert error["node"] == 3 and error["gave_up"] and error["failures"] == 1
    kinds = [(e["event"], e.get("node")) for e in events]
    returned = kinds.index(("node-returned", 3))
    assert ("arrival", 3) in kinds[returned:]
    assert result.summary["errors"] == {"node-unavailable": 1} and result.version == 16
