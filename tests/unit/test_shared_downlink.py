"""The shared downlink (``downlink-kind = "shared"``), server and device with real codecs.

The server side is :class:`fedsync.aggregation.shared_downlink.SharedDownlink`, the
device side the ClientApp's own :func:`fedsync.clientapp.compressed.apply_shared_downlink`
on a Flower ``Context``; payloads are real frames of :class:`fedsync.codecs.UpdateCodec`
(lossy ones: top-k and 8-bit uniform) inside :mod:`fedsync.wire.shared`'s container.
Equality is bit for bit (``torch.equal``) throughout.
"""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedsync.aggregation.downlink import DownlinkPayload
from fedsync.aggregation.shared_downlink import SharedDownlink, VersionEvicted, grid_of
from fedsync.aggregation.tally import RunTally
from fedsync.clientapp.compressed import (
    DOWNLINK_BASE,
    DOWNLINK_VERSION,
    DownlinkVersionMismatch,
    InitialModelMismatch,
    MissingDownlinkBase,
    apply_shared_downlink,
)
from fedsync.config import RunConfig, SettingsError
from fedsync.engine import AggregationEngine, default_codec_factory
from fedsync.models.initial import state_digest
from fedsync.protocol import TrainTask
from fedsync.serverapp import TEASQ
from fedsync.serverapp.checkpoint import restore_tally, tally_state
from fedsync.updates import TensorSpec
from fedsync.wire import ChecksumMismatch, MalformedField, PayloadError, TruncatedPayload
from fedsync.wire.shared import decode_shared, encode_changes, encode_whole, to_grid

SHAPES = {"conv.weight": (8, 4, 3, 3), "fc.weight": (40, 24), "fc.bias": (40,)}
SPECS = {name: TensorSpec(name, shape, "float32") for name, shape in SHAPES.items()}
CHANGE = "topk:0.2+uniform:8"  # lossy both ways: what it leaves out is the residual


def initial_model(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {n: 0.1 * torch.randn(s, generator=generator) for n, s in SHAPES.items()}


def downlink(
    *, max_versions: int = 8, change: str = CHANGE, seeded: bool = True, **kwargs: object
) -> SharedDownlink:
    initial = initial_model()
    return SharedDownlink(
        SPECS,
        full_codec=default_codec_factory("none+fp16", specs=SPECS),
        grid="fp16",
        delta_codec=lambda version: default_codec_factory(change, specs=SPECS),
        initial=initial if seeded else None,
        initial_digest=state_digest(initial) if seeded else "",
        max_versions=max_versions,
        **kwargs,  # type: ignore[arg-type]
    )


def context(node: int = 1) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


class Fleet:
    """The server's downlink, a global model that moves every version, and devices that
    apply what they are sent with the ClientApp's own code."""

    def __init__(self, server: SharedDownlink, *, seed: int = 1) -> None:
        self.server = server
        self.state = initial_model()
        self.version = 0
        self.contexts: dict[int, Context] = {}
        self.generator = torch.Generator().manual_seed(seed)

    def step(self, versions: int = 1) -> None:
        """The global model moves on (heavy-tailed, as real updates are)."""
        for _ in range(versions):
            for tensor in self.state.values():
                noise = torch.randn(tensor.shape, generator=self.generator)
                tensor += 0.01 * noise * noise.abs()
            self.version += 1

    def task(
        self, node: int, *, own_initial: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[DownlinkPayload, dict[str, torch.Tensor]]:
        """One task: prepare, apply on the device, commit. Returns (payload, start)."""
        payload = self.server.prepare(node, self.state, self.version)
        start = apply_shared_downlink(
            payload.payload,
            SPECS,
            self.contexts.setdefault(node, context(node)),
            version=self.version,
            initial_digest=payload.initial_digest,
            initial=own_initial if own_initial is not None else initial_model(),
        )
        self.server.commit(node)
        return payload, start


def equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor] | None) -> bool:
    return b is not None and set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def held(ctx: Context) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    arrays = ctx.state.array_records[DOWNLINK_BASE]
    return {n: arrays[n].numpy().copy() for n in arrays}, dict(
        ctx.state.config_records[DOWNLINK_VERSION]
    )


# --- the sequence -----------------------------------------------------------------------------
def test_every_device_holds_the_servers_mirror_bit_for_bit() -> None:
    fleet = Fleet(downlink())
    seen: dict[int, dict[str, torch.Tensor]] = {}  # version -> what a device started from
    for round_ in range(12):
        for node in range(5):
            if (round_ + node) % (node + 1):  # devices of different speeds: lags 0..4
                continue
            payload, start = fleet.task(node)
            assert equal(start, fleet.server.mirror), (round_, node, payload.detail)
            assert equal(start, seen.setdefault(fleet.version, start))  # the same for all
        fleet.step()
    # the residual is real: the mirror is not the global model, the lossy codec left some
    assert not equal(fleet.state, fleet.server.mirror)
    assert fleet.server.payloads["changes"] > 10
    assert fleet.server.changes_encoded == 11  # one change per version, whoever gets it
    assert fleet.server.resyncs == 0


def test_the_server_keeps_the_residual_so_nothing_is_lost() -> None:
    # What one change leaves out goes out with the next: once the model stops moving,
    # versions that change nothing bring the mirror (every device) to it.
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.step(3)
    lags = []
    for _ in range(8):
        fleet.version += 1  # a new version, the same model
        payload, start = fleet.task(0)
        assert equal(start, fleet.server.mirror)
        lags.append(payload.lag)
    assert all(later < earlier for earlier, later in itertools.pairwise(lags))
    assert lags[-1] < lags[0] / 10


def test_a_lagging_device_gets_the_changes_it_missed_in_one_frame_and_lands_on_the_mirror() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.task(1)
    for _ in range(4):  # device 1 keeps up, device 0 does not
        fleet.step()
        fleet.task(1)
    payload, start = fleet.task(0)
    assert payload.detail == "changes" and payload.links == 4
    assert equal(start, fleet.server.mirror)
    assert equal(start, fleet.server.holds(1))  # the same bits as the device that kept up
    # the frame names the versions it goes from and to
    frame = decode_shared(payload.payload)
    assert (frame.base, frame.target, [t for t, _ in frame.links]) == (0, 4, [1, 2, 3, 4])


def test_a_device_at_the_current_version_is_sent_nothing() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.step()
    fleet.task(0)
    payload, start = fleet.task(0)  # no aggregation in between
    assert payload.payload == b"" and payload.detail == "stay"
    assert equal(start, fleet.server.mirror)


def test_first_contact_at_version_0_costs_no_downlink_bytes() -> None:
    fleet = Fleet(downlink())
    payload, start = fleet.task(0)
    assert payload.payload == b"" and payload.detail == "seeded"
    assert payload.broadcast_bytes == 0
    assert payload.initial_digest == state_digest(initial_model())
    assert equal(start, initial_model())
    # a first contact later is the changes since version 0, from the device's own build
    fleet.step(2)
    payload, start = fleet.task(1)
    assert payload.detail == "changes" and payload.links == 1  # one change: 0 -> 2
    assert payload.initial_digest  # still from the seeded model
    assert equal(start, fleet.server.mirror)


def test_first_contact_at_version_0_through_the_engine_counts_zero_bytes() -> None:
    config = RunConfig.of(
        strategy="fedbuff",
        downlink_kind="shared",
        downlink_delta_codec=CHANGE,
        downlink_seeded_start=True,
        seed=3,
    )
    state = {**initial_model(), "steps": torch.tensor(4)}
    engine = AggregationEngine(config, state)
    flight = engine.plan_task(7, 1)
    assert flight.downlink_bytes == 0 and engine.tally.bytes_down == 0
    assert flight.downlink.initial_digest == state_digest(initial_model())
    task = TrainTask.for_run(
        config,
        payload=flight.downlink.payload,
        downlink_kind=flight.downlink.kind,
        version=flight.version,
        uplink_codec=flight.uplink_spec,
        task_seed=flight.seed,
        job="job",
        initial_digest=flight.downlink.initial_digest,
    )
    read = TrainTask.from_record(task.to_record())  # an empty payload travels
    assert read.payload == b"" and read.initial_digest == task.initial_digest
    assert read.downlink_kind == "shared"
    assert engine.describe()["downlink_shared"]["payloads"] == {"seeded": 1}
    assert engine.describe()["downlink_shared"]["seeded_start"] is True
    assert engine.tally.bytes_down_broadcast == 0


def test_without_the_seeded_start_a_first_contact_at_version_0_gets_the_whole_model() -> None:
    # A library app whose initial arrays the devices do not build (pretrained): no task
    # may be spent on a digest that cannot match.
    config = RunConfig.of(
        strategy="fedbuff",
        downlink_kind="shared",
        downlink_delta_codec=CHANGE,
        downlink_seeded_start=False,
    )
    pretrained = initial_model(seed=9)
    engine = AggregationEngine(config, pretrained)
    for node in (7, 8):
        flight = engine.plan_task(node, node)
        assert flight.downlink.detail == "whole" and flight.downlink_bytes > 0
        assert not flight.downlink.initial_digest
        # the device's own build is another model: it is never asked to match it
        ctx = context(node)
        start = apply_shared_downlink(flight.downlink.payload, SPECS, ctx, version=0)
        assert equal(start, {n: to_grid(t, "fp16") for n, t in pretrained.items()})
        engine.arrived(flight, 0)
        # the sequence starts on the grid: the whole model is the mirror, so the device
        # is tracked and its next task needs no whole model
        assert equal(start, engine.downlink.holds(node))
    shared = engine.describe()["downlink_shared"]
    assert shared["payloads"] == {"whole": 2} and shared["seeded_start"] is False
    assert shared["whole_reasons"] == {"first-contact": 2}
    assert engine.describe()["downlink_resyncs"] == 0


def test_a_resumed_run_does_not_assume_the_seeded_start() -> None:
    # A checkpoint's model is not version 0: every device gets the whole model first.
    config = RunConfig.of(
        strategy="fedasync-mix",
        downlink_kind="shared",
        downlink_delta_codec=CHANGE,
        downlink_seeded_start=True,
    )
    engine = AggregationEngine(config, initial_model(), version=3)
    flight = engine.plan_task(1, 1)
    assert flight.downlink.detail == "whole" and not flight.downlink.initial_digest
    ctx = context()
    start = apply_shared_downlink(flight.downlink.payload, SPECS, ctx, version=3)
    # a strategy that mixes models gets the start the device decodes, exactly
    assert equal(start, flight.downlink.start)


# --- bytes: as sent, and broadcast ------------------------------------------------------------
def test_each_change_counts_once_in_the_broadcast_figure() -> None:
    fleet = Fleet(downlink())
    for node in range(3):
        fleet.task(node)
    fleet.step()
    sent = [fleet.task(node)[0] for node in range(3)]
    frame = decode_shared(sent[0].payload).links[0][1]
    assert [p.broadcast_bytes for p in sent] == [len(frame), 0, 0]
    assert sum(len(p.payload) for p in sent) == 3 * len(sent[0].payload)
    assert fleet.server.broadcast_bytes == len(frame)


def test_the_broadcast_figure_survives_a_checkpoint() -> None:
    tally = RunTally(bytes_down=456, bytes_down_broadcast=123)
    state = json.loads(json.dumps(tally_state(tally)))
    resumed = RunTally(bytes_down_broadcast=0)  # a shared run's engine sets it
    restore_tally(resumed, state)
    assert (resumed.bytes_down, resumed.bytes_down_broadcast) == (456, 123)
    other = RunTally()
    restore_tally(other, state)
    assert other.bytes_down_broadcast is None  # not a shared run: no such figure
    assert "bytes_down_broadcast" not in tally_state(RunTally())  # other kinds: unchanged
    assert "bytes_down_broadcast" not in RunTally().summary()["target"]


# --- the cache and resyncs --------------------------------------------------------------------
def test_a_device_behind_the_cache_gets_the_whole_model_counted_as_a_resync() -> None:
    fleet = Fleet(downlink(max_versions=2))
    fleet.task(0)
    fleet.task(1)
    for _ in range(3):
        fleet.step()
        fleet.task(1)
    with pytest.raises(VersionEvicted):
        fleet.server.changes_since(0)
    payload, start = fleet.task(0)
    assert payload.detail == "whole"
    assert fleet.server.resyncs == 1 and fleet.server.whole_reasons == {"evicted": 1}
    assert payload.broadcast_bytes == len(payload.payload)  # a whole model is per device
    # the whole model is the mirror, exactly (it is on the fp16 grid): back on the sequence
    assert equal(start, fleet.server.mirror)
    fleet.step()
    payload, start = fleet.task(0)
    assert payload.detail == "changes" and equal(start, fleet.server.mirror)


def test_changes_that_outweigh_a_whole_model_are_replaced_by_it() -> None:
    fleet = Fleet(downlink(change="none+uniform:8"))  # dense: 2 changes ~ one fp16 model
    fleet.task(0)
    fleet.task(1)
    for _ in range(3):
        fleet.step()
        fleet.task(1)
    payload, start = fleet.task(0)
    assert payload.detail == "whole" and fleet.server.whole_reasons == {"cheaper": 1}
    assert equal(start, fleet.server.mirror)


def test_a_failed_task_makes_the_next_payload_whole() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.step()
    fleet.server.prepare(0, fleet.state, fleet.version)
    fleet.server.reset(0)  # the task failed or was lost: the device may hold anything
    payload, start = fleet.task(0)
    assert payload.detail == "whole" and fleet.server.whole_reasons == {"unknown": 1}
    assert equal(start, fleet.server.mirror)


def test_a_change_too_coarse_for_the_model_restarts_the_sequence() -> None:
    fleet = Fleet(downlink(change="topk:0.01+uniform:2", max_lag=0.05))
    fleet.task(0)
    fleet.step()
    payload, start = fleet.task(0)
    assert fleet.server.restarts == 1 and fleet.server.epoch == 1
    assert payload.detail == "whole" and fleet.server.whole_reasons == {"epoch": 1}
    assert equal(start, fleet.server.mirror)
    assert payload.lag < 1e-3  # the whole model: only fp16's rounding


def test_a_pruning_cut_restarts_the_sequence_without_the_seeded_start() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.server.rebase(default_codec_factory("none+fp16", specs=SPECS))
    payload, start = fleet.task(0)
    assert payload.detail == "whole" and equal(start, fleet.server.mirror)
    payload, _ = fleet.task(5)  # a first contact after the cut: no seeded start
    assert payload.detail == "whole" and not payload.initial_digest


# --- what a device refuses --------------------------------------------------------------------
def test_a_frame_from_another_base_is_refused_and_the_device_keeps_its_model() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.task(1)
    fleet.step()
    fleet.task(1)  # device 1 at version 1, device 0 at version 0
    fleet.step()
    for_one = fleet.server.prepare(1, fleet.state, fleet.version)  # changes from version 1
    before = held(fleet.contexts[0])
    with pytest.raises(DownlinkVersionMismatch, match="from version 1 of sequence 0, this node"):
        apply_shared_downlink(for_one.payload, SPECS, fleet.contexts[0], version=fleet.version)
    after = held(fleet.contexts[0])
    assert after[1] == before[1] and all(np.array_equal(before[0][n], after[0][n]) for n in SHAPES)
    # the server's answer to the refusal: a whole model, and the device is back in step
    fleet.server.reset(0)
    payload, start = fleet.task(0)
    assert payload.detail == "whole" and equal(start, fleet.server.mirror)


def test_a_frame_for_another_version_than_the_task_is_refused() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.step(2)
    payload = fleet.server.prepare(0, fleet.state, fleet.version)
    before = held(fleet.contexts[0])
    with pytest.raises(DownlinkVersionMismatch, match="for model version 2, the task starts"):
        apply_shared_downlink(payload.payload, SPECS, fleet.contexts[0], version=1)
    assert held(fleet.contexts[0])[1] == before[1]
    # an empty payload names no base: the task's version must be the one the node holds
    with pytest.raises(DownlinkVersionMismatch):
        apply_shared_downlink(b"", SPECS, fleet.contexts[0], version=2)
    # and a frame of another sequence (after a restart) is refused too
    frame = decode_shared(payload.payload)
    other = encode_changes(list(frame.links), base=frame.base, epoch=3, grid="fp16")
    with pytest.raises(DownlinkVersionMismatch, match="of sequence 3"):
        apply_shared_downlink(other, SPECS, fleet.contexts[0], version=2)
    assert held(fleet.contexts[0])[1] == before[1]


def test_a_node_without_a_base_refuses_changes() -> None:
    fleet = Fleet(downlink())
    fleet.task(0)
    fleet.step()
    payload = fleet.server.prepare(0, fleet.state, fleet.version)
    with pytest.raises(MissingDownlinkBase):  # a restarted node: empty context.state
        apply_shared_downlink(payload.payload, SPECS, context(0), version=fleet.version)


def test_another_initial_model_is_refused_by_digest_and_resynced_with_a_whole_model() -> None:
    fleet = Fleet(downlink())
    ctx = context(3)
    fleet.contexts[3] = ctx
    payload = fleet.server.prepare(3, fleet.state, fleet.version)
    with pytest.raises(InitialModelMismatch, match="this node builds"):
        apply_shared_downlink(
            payload.payload,
            SPECS,
            ctx,
            version=0,
            initial_digest=payload.initial_digest,
            initial=initial_model(seed=1),  # another run seed
        )
    assert DOWNLINK_BASE not in ctx.state.array_records  # nothing kept
    fleet.server.reset(3)  # the failed task
    payload, start = fleet.task(3, own_initial=initial_model(seed=1))
    assert payload.detail == "whole" and not payload.initial_digest
    # version 0's mirror is the exact seeded model, off the fp16 grid: the device holds
    # its fp16 rounding, so the server does not count it as on the sequence ...
    assert equal(start, {n: to_grid(t, "fp16") for n, t in initial_model().items()})
    assert fleet.server.holds(3) is None
    fleet.step()
    payload, start = fleet.task(3, own_initial=initial_model(seed=1))
    assert payload.detail == "whole"  # ... and sends a whole model once more,
    fleet.step()
    payload, start = fleet.task(3, own_initial=initial_model(seed=1))
    assert payload.detail == "changes" and equal(start, fleet.server.mirror)  # then changes


def test_a_model_of_another_shape_is_refused_too() -> None:
    fleet = Fleet(downlink())
    payload = fleet.server.prepare(0, fleet.state, 0)
    smaller = {n: t for n, t in initial_model().items() if n != "fc.bias"}
    with pytest.raises(InitialModelMismatch):
        apply_shared_downlink(
            b"", SPECS, context(), version=0, initial_digest=payload.initial_digest, initial=smaller
        )


# --- the frame --------------------------------------------------------------------------------
def test_the_frame_round_trips_and_names_its_faults() -> None:
    links = [(3, b"abc"), (5, b""), (9, b"x" * 300)]
    payload = encode_changes(links, base=1, epoch=2, grid="bf16")
    frame = decode_shared(payload)
    assert (frame.grid, frame.epoch, frame.base, frame.target) == ("bf16", 2, 1, 9)
    assert list(frame.links) == links and frame.whole is None
    whole = decode_shared(encode_whole(b"model", target=4, epoch=0, grid="fp32"))
    assert (whole.whole, whole.target, whole.base, whole.links) == (b"model", 4, -1, ())
    with pytest.raises(TruncatedPayload):
        decode_shared(payload[:5])
    with pytest.raises(ChecksumMismatch):
        decode_shared(payload[:-1] + bytes([payload[-1] ^ 1]))
    body = bytearray(payload[:-4])
    body[-300 - 2 - 1] = 4  # the last link's target, 9 -> 4: versions must increase
    with pytest.raises(MalformedField, match="do not increase"):
        decode_shared(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(ValueError, match="must increase"):
        encode_changes([(1, b"")], base=1, epoch=0, grid="fp16")
    # a broken frame is a PayloadError on the device, which keeps its model
    with pytest.raises(PayloadError):
        apply_shared_downlink(payload[:-1], SPECS, context(), version=9)


# --- settings ---------------------------------------------------------------------------------
def test_the_mode_is_a_run_config_key_and_a_strategy_argument() -> None:
    config = RunConfig.of(downlink_kind="shared", downlink_max_versions=4)
    assert config.compression.downlink_max_versions == 4
    strategy = TEASQ(downlink_kind="shared", downlink_max_versions=3)
    assert strategy.config.compression.downlink_kind == "shared"
    assert strategy.config.compression.downlink_max_versions == 3
    # the default is unchanged: delta downlinks
    assert RunConfig.of().compression.downlink_kind == "delta"
    # the seeded start: off by default (a library app's own model is not seeded), on
    # by key or argument
    assert RunConfig.of().compression.downlink_seeded_start is False
    on = RunConfig.from_run_config({"downlink-kind": "shared", "downlink-seeded-start": True})
    assert on.compression.downlink_seeded_start is True
    strategy = TEASQ(downlink_kind="shared", downlink_seeded_start=True)
    assert strategy.config.compression.downlink_seeded_start is True
    assert TEASQ(downlink_kind="shared").config.compression.downlink_seeded_start is False


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"downlink_codec": "none+uniform:8"}, "carries a model exactly"),
        ({"downlink_codec": "topk:0.5+fp16"}, "carries a model exactly"),
        ({"downlink_max_versions": 0}, "downlink-max-versions"),
    ],
)
def test_settings_the_shared_mode_cannot_use_are_refused(
    settings: dict[str, object], match: str
) -> None:
    with pytest.raises(SettingsError, match=match):
        RunConfig.of(downlink_kind="shared", **settings)


def test_a_change_codec_with_error_feedback_is_refused() -> None:
    config = RunConfig.of(
        strategy="fedbuff", downlink_kind="shared", downlink_delta_codec="topk:0.1+uniform:8+ef"
    )
    with pytest.raises(SettingsError, match="server keeps the one residual"):
        AggregationEngine(config, initial_model())


def test_grids_of_whole_model_codecs() -> None:
    assert [grid_of(s) for s in ("none+fp16", "none+fp32", "none", "none+bf16")] == [
        "fp16",
        "fp32",
        "fp32",
        "bf16",
    ]
