"""The relay downlink: every device replays the server's aggregations and holds the
server's model, bit for bit.

The real engine aggregates the real codec's SparseLoCo-style frames (top-k of chunks,
2-bit bin means) under the selected mean, staleness weights scaled back into the step
and Delayed Nesterov; each "device" applies its task's downlink with the ClientApp's own
function (:func:`fedsync.clientapp.compressed.apply_relay_downlink`, a real Flower
``Context``), trains (a seeded random step) and replies with its encoded update.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch
from flwr.app import Context, RecordDict

from fedsync.clientapp.compressed import (
    DOWNLINK_BASE,
    RELAY_SENT_KEPT,
    RELAY_VERSION,
    DownlinkVersionMismatch,
    MissingDownlinkBase,
    apply_relay_downlink,
    keep_sent_uplink,
)
from fedsync.clientapp.node_store import NodeStore
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.engine import AggregationEngine, InFlight
from fedsync.models.initial import state_digest
from fedsync.updates import TensorSpec
from fedsync.wire import PayloadError
from fedsync.wire.errors import MalformedField
from fedsync.wire.relay import RelayEntry, decode_relay, encode_relay, encode_step, uplink_digest

SHAPES = {"w": (64, 64), "b": (64,)}
SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}
UPLINK = "chunktopk:128+binmean:2"


def initial() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def engine_for(**values: Any) -> AggregationEngine:
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 3,
        "buffer_size": 2,
        "uplink_codec": UPLINK,
        "buffer_mean": "selected",
        "staleness": "polynomial:0.5",
        "staleness_scales_step": True,
        "server_optimizer": "delayed-nesterov",
        "server_learning_rate": 0.7,
        "downlink_kind": "relay",
        "downlink_codec": "none+fp32",
        "downlink_seeded_start": True,
        **values,
    }
    return AggregationEngine(RunConfig.of(**settings), initial())


def context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def start_of(plan: InFlight, ctx: Context) -> dict[str, torch.Tensor]:
    """What the device trains from: its task's downlink applied as the ClientApp does."""
    return apply_relay_downlink(
        plan.downlink.payload,
        SPECS,
        ctx,
        version=plan.version,
        initial_digest=plan.downlink.initial_digest,
        initial=initial(),
    )


def trained_reply(plan: InFlight, start: dict[str, torch.Tensor], ctx: Context) -> bytes:
    """The device's encoded update, kept as the ClientApp's ``encode_uplink`` keeps it."""
    generator = torch.Generator().manual_seed(plan.seed)
    delta = {name: 0.01 * torch.randn(t.shape, generator=generator) for name, t in start.items()}
    payload = UpdateCodec(plan.uplink_spec).encode(delta)
    keep_sent_uplink(payload, NodeStore.of(ctx))
    return payload


def run_rounds(engine: AggregationEngine, contexts: dict[int, Context], rounds: int) -> int:
    """``rounds`` aggregations, each from one task of every device in ``contexts`` (in
    order), each device applying its downlink as the ClientApp does; the tasks planned."""
    number = 0
    for _ in range(rounds):
        for node, ctx in contexts.items():
            number += 1
            plan = engine.plan_task(node, number)
            start = start_of(plan, ctx)
            engine.arrived(plan, 1)
            engine.receive(plan, trained_reply(plan, start, ctx), 10)
    return number


def test_every_device_replays_to_the_servers_model_bit_for_bit() -> None:
    engine = engine_for()
    history = {0: {name: t.clone() for name, t in engine.trained.items()}}
    contexts = {node: context(node) for node in (1, 2, 3)}
    flights = {node: engine.plan_task(node, node) for node in contexts}
    number = 3
    order = [1, 1, 2, 1, 3, 2, 1, 1, 3, 2] * 4  # the fast device replies most often
    for node in order:
        plan = flights[node]
        start = start_of(plan, contexts[node])
        # The device's start is the server's model of the task's version, bit for bit.
        for name in SPECS:
            assert torch.equal(start[name], history[plan.version][name]), (number, name)
        engine.arrived(plan, 1)
        reply = trained_reply(plan, start, contexts[node])
        assert engine.receive(plan, reply, 10).status != "rejected"
        history[engine.version] = {name: t.clone() for name, t in engine.trained.items()}
        number += 1
        flights[node] = engine.plan_task(node, number)
    assert engine.version >= 15
    assert max(plan.version for plan in flights.values()) == engine.version
    described = engine.describe()["downlink"]
    assert described["optimizer"]["kind"] == "delayed-nesterov"
    assert described["payloads"]["replay"] > 0
    assert max(int(k) for k in described["aggregations_per_payload"]) >= 2  # lagging ones
    # Every device replayed its own updates from what it kept, not from the frame.
    assert described["own_named"] >= len(order) // 2
    assert described["own_bytes_saved"] > 0


def test_a_frame_names_the_devices_own_update_instead_of_carrying_it() -> None:
    engine = engine_for()
    contexts = {node: context(node) for node in (1, 2)}
    number = run_rounds(engine, contexts, 1)  # version 1: one update of each
    sent = {}
    for node, ctx in contexts.items():
        kept = ctx.state.array_records["fedsync-relay-sent"]
        sent[node] = next(iter(kept.values())).numpy().tobytes()
    plans = {node: engine.plan_task(node, number + node) for node in contexts}
    outsider = engine.plan_task(3, number + 3)  # unknown to the server: every payload
    inline = decode_relay(outsider.downlink.payload).steps[0].entries
    assert [entry.payload for entry in inline] == [sent[1], sent[2]]
    for node, plan in plans.items():
        entries = decode_relay(plan.downlink.payload).steps[0].entries
        own = [entry for entry in entries if entry.own]
        assert len(own) == 1 and own[0].payload == b""
        assert own[0].own == uplink_digest(sent[node])
        saved = len(outsider.downlink.payload) - len(plan.downlink.payload)
        assert saved == len(sent[node]) + varint_size(len(sent[node])) - 16
        replayed = start_of(plan, contexts[node])
        for name in SPECS:
            assert torch.equal(replayed[name], engine.trained[name])
        # Named once, replayed once: the kept copy is dropped.
        assert len(contexts[node].state.array_records["fedsync-relay-sent"]) == 0


def test_a_device_that_lost_what_it_sent_refuses_and_is_replayed_from_zero() -> None:
    engine = engine_for()
    contexts = {node: context(node) for node in (1, 2)}
    number = run_rounds(engine, contexts, 2)
    ctx = contexts[1]
    del ctx.state.array_records["fedsync-relay-sent"]
    held = {k: v.numpy().copy() for k, v in ctx.state.array_records[DOWNLINK_BASE].items()}
    version = dict(ctx.state.config_records[RELAY_VERSION])
    plan = engine.plan_task(1, number + 1)
    with pytest.raises(MissingDownlinkBase, match="own updates"):
        start_of(plan, ctx)
    for name, array in held.items():
        assert (ctx.state.array_records[DOWNLINK_BASE][name].numpy() == array).all()
    assert dict(ctx.state.config_records[RELAY_VERSION]) == version
    engine.forget(plan)  # the failed task: the server replays it from version 0, inline
    again = engine.plan_task(1, number + 2)
    frame = decode_relay(again.downlink.payload)
    assert frame.base == 0 and not frame.own
    replayed = start_of(again, ctx)
    for name in SPECS:
        assert torch.equal(replayed[name], engine.trained[name])


def test_the_sent_frames_kept_are_bounded() -> None:
    ctx = context(1)
    for index in range(RELAY_SENT_KEPT + 3):
        keep_sent_uplink(bytes([index]) * 10, NodeStore.of(ctx))
    kept = ctx.state.array_records["fedsync-relay-sent"]
    assert len(kept) == RELAY_SENT_KEPT
    assert sorted(bytes(kept[key].numpy()) for key in kept)[0] == bytes([3]) * 10


def test_an_unknown_update_source_is_a_typed_error() -> None:
    entry = RelayEntry(1.0, UPLINK, b"", b"\x02" * 16)
    step = encode_step(1.0, [entry])
    frame = encode_relay([step], base=0, target=1, mean="selected", optimizer="{}")
    assert decode_relay(frame).steps[0].entries == (entry,)
    position = frame.index(b"\x02" * 16) - 1  # the source byte before the digest
    broken = bytearray(frame[:-4])
    broken[position] = 7
    with pytest.raises(MalformedField, match="source"):
        decode_relay(bytes(broken) + zlib.crc32(bytes(broken)).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="digest"):
        encode_step(1.0, [RelayEntry(1.0, UPLINK, b"x", b"\x01" * 16)])


def test_a_device_that_lost_its_task_replays_from_version_zero() -> None:
    engine = engine_for()
    number = run_rounds(engine, {node: context(node) for node in (1, 2)}, 4)
    assert engine.version == 4
    lost = engine.plan_task(1, number + 1)
    engine.forget(lost)  # its state is unknown now
    again = engine.plan_task(1, number + 2)
    assert again.downlink.initial_digest and decode_relay(again.downlink.payload).base == 0
    fresh = context(9)  # a restarted node: nothing kept
    replayed = start_of(again, fresh)
    for name in SPECS:
        assert torch.equal(replayed[name], engine.trained[name])
    assert engine.downlink.describe()["resyncs"] == 1


def test_bad_frames_are_typed_errors_and_leave_the_node_as_it_was() -> None:
    engine = engine_for()
    ctx = context(1)
    first = engine.plan_task(1, 1)
    start = start_of(first, ctx)
    engine.arrived(first, 1)
    engine.receive(first, trained_reply(first, start, ctx), 10)
    other = engine.plan_task(2, 2)
    engine.arrived(other, 1)
    second = context(2)
    engine.receive(other, trained_reply(other, start_of(other, second), second), 10)
    plan = engine.plan_task(1, 3)
    held = {k: v.numpy().copy() for k, v in ctx.state.array_records[DOWNLINK_BASE].items()}
    version = dict(ctx.state.config_records[RELAY_VERSION])
    payload = plan.downlink.payload
    for broken in (payload[:-7], payload[:20], b"FSRY" + payload[4:-4] + b"\0\0\0\0"):
        with pytest.raises(PayloadError):
            apply_relay_downlink(broken, SPECS, ctx, version=plan.version)
    with pytest.raises(DownlinkVersionMismatch):
        apply_relay_downlink(payload, SPECS, ctx, version=plan.version + 1)
    with pytest.raises(MissingDownlinkBase):
        apply_relay_downlink(payload, SPECS, context(5), version=plan.version)
    after = ctx.state.array_records[DOWNLINK_BASE]
    for name, array in held.items():
        assert (after[name].numpy() == array).all()
    assert dict(ctx.state.config_records[RELAY_VERSION]) == version


def test_the_frame_holds_the_payloads_as_they_came() -> None:
    engine = engine_for()
    sent = []
    for node in (1, 2):
        plan = engine.plan_task(node, node)
        engine.arrived(plan, 1)
        payload = trained_reply(plan, initial(), context(node))
        sent.append(payload)
        engine.receive(plan, payload, 10)
    frame = decode_relay(engine.plan_task(3, 3).downlink.payload)
    assert (frame.base, frame.target, frame.mean) == (0, 1, "selected")
    assert [entry.payload for entry in frame.steps[0].entries] == sent
    assert [entry.codec for entry in frame.steps[0].entries] == [UPLINK, UPLINK]
    assert frame.steps[0].factor == 1.0  # both fresh: the step is not scaled


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"downlink_seeded_start": False}, "downlink-seeded-start"),
        ({"prune_at_version": 3}, "pruning"),
        ({"strategy": "fedasync-mix", "buffer_mean": "auto"}, "cannot replay strategy"),
    ],
)
def test_the_engine_refuses_a_relay_it_cannot_keep_exact(values: dict[str, Any], why: str) -> None:
    with pytest.raises(SettingsError, match=why):
        engine_for(**values)


def test_the_initial_digest_is_the_servers() -> None:
    engine = engine_for()
    plan = engine.plan_task(1, 1)
    assert plan.downlink.payload == b"" and plan.downlink.initial_digest == state_digest(initial())


def test_a_replay_that_fails_midway_or_lacks_the_optimizer_leaves_the_node_as_it_was() -> None:
    from fedsync.clientapp.compressed import RELAY_OPTIMIZER

    engine = engine_for()
    ctx = context(1)
    # Three aggregations the node replays: a velocity to keep.
    number = run_rounds(engine, {1: ctx, 2: context(2)}, 3)
    plan = engine.plan_task(1, number + 1)
    frame = decode_relay(plan.downlink.payload)
    steps = [
        encode_step(
            step.factor,
            [
                RelayEntry(
                    e.weight, "none+fp32" if i == len(frame.steps) - 1 else e.codec, e.payload
                )
                for e in step.entries
            ],
        )
        for i, step in enumerate(frame.steps)
    ]
    forged = encode_relay(
        steps, base=frame.base, target=frame.target, mean=frame.mean, optimizer=frame.optimizer
    )
    held = {k: v.numpy().copy() for k, v in ctx.state.array_records[DOWNLINK_BASE].items()}
    with pytest.raises(PayloadError):  # the last aggregation names another codec
        apply_relay_downlink(forged, SPECS, ctx, version=plan.version)
    for name, array in held.items():
        assert (ctx.state.array_records[DOWNLINK_BASE][name].numpy() == array).all()
    replayed = apply_relay_downlink(plan.downlink.payload, SPECS, ctx, version=plan.version)
    for name in SPECS:
        assert torch.equal(replayed[name], engine.trained[name])
    del ctx.state.array_records[RELAY_OPTIMIZER]  # the velocity copy is lost
    engine.arrived(plan, 1)
    engine.receive(plan, trained_reply(plan, replayed, ctx), 10)
    step = engine.plan_task(2, number + 2)
    engine.arrived(step, 1)
    engine.receive(step, trained_reply(step, replayed, context(2)), 10)
    later = engine.plan_task(1, number + 3)
    with pytest.raises(MissingDownlinkBase, match="optimizer"):
        apply_relay_downlink(later.downlink.payload, SPECS, ctx, version=later.version)
