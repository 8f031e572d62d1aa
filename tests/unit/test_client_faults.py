"""Fault injection (node config ``fault``) against the server's checks.

Each fault kind corrupts a real codec frame the way :mod:`fedsync.clientapp.faults` does on a
deployed node; the asynchronous loop (on the fake Grid of ``test_async_run``) must
reject every such reply, count it by kind, and leave the global model untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict

from fedsync import protocol
from fedsync.aggregation.guard import UpdateNormGuard
from fedsync.clientapp.faults import FAULT_KINDS, FaultInjector
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.records import get_int, get_str
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.run import AsyncResult, run_async
from fedsync.updates import TensorSpec
from tests.unit.test_async_run import (
    SHAPES,
    FakeGrid,
    initial_state,
    make_evaluate,
    targets_for,
    task_identity,  # noqa: F401  (autouse: Flower's task identity for Message())
)

SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}


class Nodes:
    """ClientApp stand-in: a small honest step towards a per-node target, encoded with
    the real codec; nodes with an injector corrupt the frame as a faulty node would."""

    def __init__(self, injectors: Mapping[int, FaultInjector]) -> None:
        self.injectors = dict(injectors)
        self.tasks: dict[int, int] = {}
        self.models: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, message: Message) -> Message:
        if message.metadata.message_type == MessageType.QUERY:
            return Message(Error(code=2, reason="no probe here"), reply_to=message)
        node = message.metadata.dst_node_id
        config = message.content.config_records[protocol.CONFIG]
        payload = message.content.array_records[protocol.DOWNLINK][protocol.PAYLOAD].numpy()
        start = {
            name: tensor.to_dense()
            for name, tensor in UpdateCodec().decode(payload.tobytes(), SPECS).items()
        }
        target = targets_for(node)
        delta = {name: 0.5 * (target[name] - start[name]) for name in SHAPES}
        spec = get_str(config, protocol.UPLINK_CODEC)
        seed = get_int(config, protocol.TASK_SEED)
        body = UpdateCodec(spec, seed=seed).encode(delta)
        injector = self.injectors.get(node)
        if injector is not None:
            index = self.tasks.get(node, 0)
            self.tasks[node] = index + 1
            kind = injector.pick(index, seed)
            body = injector.corrupt(kind, body, delta, spec, seed) if kind else body
        metrics = MetricRecord({protocol.NUM_EXAMPLES: 10, protocol.NUM_STEPS: 1})
        uplink = ArrayRecord({protocol.PAYLOAD: Array(np.frombuffer(body, np.uint8).copy())})
        return Message(
            RecordDict({protocol.UPLINK: uplink, protocol.METRICS: metrics}), reply_to=message
        )


def run(
    tmp_path: Path,
    name: str,
    nodes: list[int],
    injectors: Mapping[int, FaultInjector],
    guard: UpdateNormGuard | None,
    **overrides: Any,
) -> tuple[AsyncResult, list[dict[str, Any]]]:
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 3,
        "buffer_size": 2,
        "max_aggregations": 6,
        "eval_every": 3,
        "max_retries": 20,
        "probe_timeout": 0.0,
        "uplink_codec": "topk:{density}+uniform:{bits}+ef",
        "downlink_codec": "none+fp32",
        "plots": False,
    }
    settings.update(overrides)
    recorder = RunRecorder(tmp_path, name)
    try:
        result = run_async(
            FakeGrid(nodes, Nodes(injectors)),  # type: ignore[arg-type]
            RunConfig.of(**settings),
            recorder=recorder,
            global_state=initial_state(),
            evaluate_fn=make_evaluate(nodes),
            norm_guard=guard,
            sleep=lambda _: None,
        )
    finally:
        recorder.close()
    return result, list(read_events(recorder.events_path))


EXPECTED = {
    "truncate": "decode:",
    "bitflip": "decode:",  # the CRC, or the length field if the flip landed there
    "garbage": "decode:BadMagic",
    "nan": "decode:NonFiniteUpdate",
    "inf": "decode:NonFiniteUpdate",
    "shape": "decode:UpdateMismatch",
    "norm": "norm",
    "codec": "codec-mismatch",
}


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_fault_is_rejected_and_the_model_never_moves(tmp_path: Path, kind: str) -> None:
    """One node, always faulty: nothing may reach the global model."""
    result, events = run(
        tmp_path,
        kind,
        [7],
        {7: FaultInjector((kind,))},
        UpdateNormGuard(max_norm=50.0),  # no history with one node: the absolute cap
        max_tasks=5,
    )
    summary = result.summary
    assert result.version == 0 and summary["aggregated_updates"] == 0
    assert summary["drops"] == {"rejected": 5} and summary["arrivals"] == 5
    rejections = summary["rejections"]
    assert all(k.startswith(EXPECTED[kind]) for k in rejections) and sum(rejections.values()) == 5
    initial = initial_state()
    for name, tensor in result.global_state.items():
        assert torch.equal(tensor, initial[name]), name
    drops = [e for e in events if e["event"] == "drop"]
    assert all(e["reason"] == "rejected" and e["rejection"] in rejections for e in drops)


def test_an_absurd_norm_among_honest_nodes_is_caught_by_the_median(tmp_path: Path) -> None:
    """No absolute cap: the relative one rejects every scaled update, honest ones pass.

    With C = 3 and four nodes the hostile one gets its first task only after an honest
    reply is in, so the median has history by then (``min_history=1`` here)."""
    result, _ = run(
        tmp_path,
        "median",
        [1, 2, 3, 4],
        {4: FaultInjector(("norm",))},
        UpdateNormGuard(outlier_factor=100.0, min_history=1),
        max_aggregations=10,
        max_retries=100,
    )
    summary = result.summary
    hostile = summary["devices"]["4"]
    assert hostile["completed"] == 0 and hostile["failures"] >= 3
    assert summary["rejections"] == {"norm": hostile["failures"]}
    assert summary["update_guard"]["rejected"] == hostile["failures"]
    assert result.version == 10
    accuracy = [e["accuracy"] for e in result.evaluations]
    assert accuracy[-1] > accuracy[0]


def test_node_config_parsing() -> None:
    assert FaultInjector.from_node_config({}) is None
    assert FaultInjector.from_node_config({"fault": ""}) is None
    injector = FaultInjector.from_node_config({"fault": "nan, norm", "fault-rate": 1})
    assert injector == FaultInjector(("nan", "norm"), 1.0)
    assert [injector.pick(i, seed=0) for i in range(4)] == ["nan", "norm", "nan", "norm"]
    never = FaultInjector(("nan",), rate=0.0)
    assert {never.pick(i, seed=3) for i in range(20)} == {""}
    some = FaultInjector(("nan",), rate=0.5)
    assert {some.pick(i, seed=3) for i in range(40)} == {"", "nan"}
    with pytest.raises(SettingsError, match="unknown kinds"):
        FaultInjector.from_node_config({"fault": "nan,typo"})
    with pytest.raises(SettingsError, match="fault-rate"):
        FaultInjector.from_node_config({"fault": "nan", "fault-rate": 2.0})


def test_corruptions_are_well_formed_where_they_should_be() -> None:
    """nan / inf / shape / norm keep a valid checksum: the deeper checks must work."""
    from fedsync.wire import decode_frame

    delta = {name: torch.randn(shape) * 0.01 for name, shape in SHAPES.items()}
    spec = "topk:0.1+uniform:8+ef"
    honest = UpdateCodec(spec, seed=1).encode(delta)
    injector = FaultInjector(FAULT_KINDS)
    for kind in ("nan", "inf", "norm"):  # against the model's schema: no error
        decode_frame(injector.corrupt(kind, honest, delta, spec, seed=1), expected=SPECS)
    decode_frame(injector.corrupt("shape", honest, delta, spec, seed=1))  # its own table
    for codes_only in ("none+fp16", "none+fp32", "none+bf16"):
        payload = UpdateCodec(codes_only).encode(delta)
        bad = injector.corrupt("nan", payload, delta, codes_only, seed=1)
        with pytest.raises(ValueError, match="NaN or Inf"):
            UpdateCodec().decode(bad, SPECS)


@pytest.mark.parametrize(
    ("spec", "other"),
    [("topk:0.1+uniform:8+ef", "none+fp32"), ("none+fp32", "none+fp16")],
)
def test_a_codec_fault_is_a_valid_frame_of_another_codec(spec: str, other: str) -> None:
    """The frame decodes, to the honest update, for a receiver that takes any codec; the
    server's (``own_spec_only``) refuses it on its header."""
    from fedsync.wire import UnexpectedCodec, inspect_frame

    delta = {name: torch.randn(shape) * 0.01 for name, shape in SHAPES.items()}
    honest = UpdateCodec(spec, seed=1).encode(delta)
    frame = FaultInjector(("codec",)).corrupt("codec", honest, delta, spec, seed=1)
    assert inspect_frame(frame, expected=SPECS)[0] == other
    assigned = UpdateCodec(spec)
    decoded = assigned.decode(frame, SPECS)
    for name, tensor in delta.items():
        exact = tensor if other == "none+fp32" else tensor.half().float()
        assert torch.equal(decoded[name].to_dense(), exact), name
    with pytest.raises(UnexpectedCodec) as info:
        assigned.decode(frame, SPECS, own_spec_only=True)
    assert info.value.expected == repr(assigned.spec) and info.value.got == repr(other)
    assigned.decode(honest, SPECS, own_spec_only=True)  # the honest frame still passes


def test_faults_still_reach_the_server_after_a_pruning_cut() -> None:
    """After a cut the task's spec names masks (``mask:digest=...``): the re-encoding
    faults use them, so the node sends a bad frame instead of failing the task."""
    from fedsync.compression.pruning import magnitude_masks, mask_digest, masked_spec
    from fedsync.wire import PayloadError, UnexpectedCodec

    delta = {name: torch.randn(shape) * 0.01 for name, shape in SHAPES.items()}
    masks = magnitude_masks({name: torch.randn(shape) for name, shape in SHAPES.items()}, 0.8)
    spec = masked_spec("topk:0.1+uniform:8+ef", mask_digest(masks))
    honest = UpdateCodec(spec, seed=1, masks=masks).encode(delta)
    injector = FaultInjector(FAULT_KINDS)
    server = UpdateCodec(masks=masks)
    poisoned = server.decode(injector.corrupt("norm", honest, delta, spec, 1, masks), SPECS)
    plain = server.decode(honest, SPECS)
    name = next(iter(SPECS))
    assert poisoned[name].values.norm() > 100 * plain[name].values.norm()
    for kind in ("shape", "nan"):
        with pytest.raises(PayloadError):
            server.decode(injector.corrupt(kind, honest, delta, spec, 1, masks), SPECS)
    other = injector.corrupt("codec", honest, delta, spec, 1, masks)
    assert server.decode(other, SPECS)  # well-formed: only the task's codec refuses it
    with pytest.raises(UnexpectedCodec):
        UpdateCodec(spec, masks=masks).decode(other, SPECS, own_spec_only=True)
