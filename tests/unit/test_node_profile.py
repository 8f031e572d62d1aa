"""The probe's reply: what a node says about itself, and how bad replies are read."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsync import protocol
from fedsync.protocol import NodeProfile
from fedsync.serverapp.probe import PULL_WAIT_FACTOR, device_order, probe_nodes


def test_profile_round_trips_through_its_record() -> None:
    profile = NodeProfile(3, num_partitions=8, device="cuda:0", device_class="jetson-orin")
    assert NodeProfile.from_record(profile.to_record()) == profile
    assert profile.describe() == {"device": "cuda:0", "device_class": "jetson-orin"}


def test_missing_or_wrongly_typed_fields_are_left_empty() -> None:
    assert NodeProfile.from_record(RecordDict()) == NodeProfile(None)
    content = RecordDict(
        {
            protocol.METRICS: MetricRecord({protocol.PARTITION_ID: 2.5}),
            protocol.NODE: ConfigRecord({protocol.DEVICE: 7, protocol.DEVICE_CLASS: "x" * 999}),
        }
    )
    profile = NodeProfile.from_record(content)
    assert profile.partition_id is None and profile.device == ""
    assert profile.device_class == "x" * 200  # free text, bounded


def test_device_order_is_by_partition_then_silent_nodes_by_id() -> None:
    profiles = {40: NodeProfile(0), 50: NodeProfile(1), 30: NodeProfile(None)}
    assert device_order([50, 10, 40, 20, 30], profiles) == [40, 50, 10, 20, 30]


class SlowGrid:
    """A Grid whose every pull takes ``cost`` real seconds and answers one probe."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.sent: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        self.sent = list(messages)
        return [f"m{i}" for i in range(len(self.sent))]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        time.sleep(self.cost)
        first = min(message_ids, key=lambda mid: int(mid[1:]))
        query = self.sent[int(first[1:])]
        query.metadata.__dict__["_message_id"] = first
        profile = NodeProfile(int(first[1:]), num_partitions=len(self.sent))
        return [Message(profile.to_record(), reply_to=query)]


def test_the_probe_waits_out_its_pulls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pull is followed by a wait of at least PULL_WAIT_FACTOR times its length, even
    when it brought answers: a pull of thousands of ids would otherwise hold the
    engine's state lock back to back."""
    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    waits: list[float] = []
    grid = SlowGrid(cost=0.02)
    found = probe_nodes(grid, [11, 12, 13], timeout=30.0, sleep=waits.append)  # type: ignore[arg-type]
    assert {node: p.partition_id for node, p in found.items()} == {11: 0, 12: 1, 13: 2}
    assert len(waits) == 2  # after the first and second pull; none once all answered
    assert all(wait >= PULL_WAIT_FACTOR * 0.02 for wait in waits), waits
