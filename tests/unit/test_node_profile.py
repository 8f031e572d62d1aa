"""The probe's reply: what a node says about itself, and how bad replies are read."""

from __future__ import annotations

from flwr.app import ConfigRecord, MetricRecord, RecordDict

from fedsync import protocol
from fedsync.protocol import NodeProfile
from fedsync.server.probe import device_order


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
