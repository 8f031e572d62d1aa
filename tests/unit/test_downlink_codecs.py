"""A device decodes its downlink with the codec its task names, as the server decodes an
uplink: a delta or shared frame of another codec is a typed error
(:class:`~fedsync.wire.UnexpectedCodec`) and the node's state is left as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedsync.clientapp.compressed import DOWNLINK_BASE, apply_downlink, apply_shared_downlink
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig
from fedsync.engine import AggregationEngine
from fedsync.protocol import DOWNLINK_CODECS, TrainTask
from fedsync.updates import TensorSpec
from fedsync.wire import UnexpectedCodec
from fedsync.wire.shared import decode_shared, encode_changes

SHAPES = {"w": (64, 64), "b": (64,)}
SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}


def engine_for(**values: Any) -> AggregationEngine:
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 2,
        "buffer_size": 1,
        "uplink_codec": "none+fp32",
        "downlink_codec": "none+fp32",
        "downlink_delta_codec": "none+uniform:8",
        **values,
    }
    state = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    return AggregationEngine(RunConfig.of(**settings), state)


def context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def step(engine: AggregationEngine, node: int, number: int) -> None:
    plan = engine.plan_task(node, number)
    engine.arrived(plan, 1)
    update = {name: torch.full(shape, 0.1 * number) for name, shape in SHAPES.items()}
    engine.receive(plan, UpdateCodec(plan.uplink_spec).encode(update), 10)


def test_a_delta_in_another_codec_than_the_task_names_is_refused() -> None:
    engine = engine_for(downlink_kind="delta")
    ctx = context()
    first = engine.plan_task(1, 1)
    assert first.downlink.codecs == ("none+fp32",)  # a full model first
    apply_downlink(first.downlink.payload, "full", SPECS, ctx, codecs=first.downlink.codecs)
    engine.arrived(first, 1)
    zeros = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    engine.receive(first, UpdateCodec("none+fp32").encode(zeros), 10)
    step(engine, 2, 2)
    delta = engine.plan_task(1, 3)
    assert delta.downlink.kind == "delta" and delta.downlink.codecs == ("none+uniform:8",)
    held = {k: v.numpy().copy() for k, v in ctx.state.array_records[DOWNLINK_BASE].items()}
    other = UpdateCodec("none+fp16").encode(
        {name: torch.ones(shape) for name, shape in SHAPES.items()}
    )
    with pytest.raises(UnexpectedCodec):
        apply_downlink(other, "delta", SPECS, ctx, codecs=delta.downlink.codecs)
    for name, array in held.items():
        np.testing.assert_array_equal(ctx.state.array_records[DOWNLINK_BASE][name].numpy(), array)
    start = apply_downlink(
        delta.downlink.payload, "delta", SPECS, ctx, codecs=delta.downlink.codecs
    )
    assert set(start) == set(SPECS)


def test_a_shared_change_in_another_codec_is_refused() -> None:
    engine = engine_for(
        downlink_kind="shared",
        downlink_seeded_start=True,
        downlink_delta_codec="topk:0.1+uniform:8",
    )
    ctx = context()
    initial = {name: t.clone() for name, t in engine.trained.items()}
    first = engine.plan_task(1, 1)
    apply_shared_downlink(
        first.downlink.payload,
        SPECS,
        ctx,
        version=0,
        initial_digest=first.downlink.initial_digest,
        initial=initial,
        codecs=first.downlink.codecs,
    )
    engine.arrived(first, 1)
    sparse = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    sparse["w"][:4] = 0.5  # 6 % of the values: the change's top 10 % holds all of it
    engine.receive(first, UpdateCodec("none+fp32").encode(sparse), 10)
    plan = engine.plan_task(1, 2)
    frame = decode_shared(plan.downlink.payload)
    assert plan.downlink.codecs == ("topk:0.1+uniform:8",) and len(frame.links) == 1
    forged = encode_changes(
        [
            (
                frame.target,
                UpdateCodec("none+fp32").encode({n: torch.ones(s) for n, s in SHAPES.items()}),
            )
        ],
        base=frame.base,
        epoch=frame.epoch,
        grid=frame.grid,
    )
    held = {k: v.numpy().copy() for k, v in ctx.state.array_records[DOWNLINK_BASE].items()}
    with pytest.raises(UnexpectedCodec):
        apply_shared_downlink(forged, SPECS, ctx, version=plan.version, codecs=plan.downlink.codecs)
    for name, array in held.items():
        np.testing.assert_array_equal(ctx.state.array_records[DOWNLINK_BASE][name].numpy(), array)
    apply_shared_downlink(
        plan.downlink.payload, SPECS, ctx, version=plan.version, codecs=plan.downlink.codecs
    )


def test_the_task_carries_the_codecs_and_checks_them() -> None:
    task = TrainTask.for_run(
        RunConfig.of(strategy="fedbuff"),
        payload=b"x",
        downlink_kind="delta",
        version=3,
        uplink_codec="none+fp32",
        task_seed=1,
        job="job",
        downlink_codecs=("topk:0.1+uniform:8",),
    )
    record = task.to_record()
    assert list(record["config"][DOWNLINK_CODECS]) == ["topk:0.1+uniform:8"]
    assert TrainTask.from_record(record).downlink_codecs == ("topk:0.1+uniform:8",)
    record["config"][DOWNLINK_CODECS] = [""]
    with pytest.raises(ValueError, match="downlink-codecs"):
        TrainTask.from_record(record)
