"""AB-Training: the factored form, a task's round trip through the real engine and the
real ClientApp path, and what bad factors do.

The engine (:class:`fedsync.engine.AggregationEngine`) plans tasks with a side and the
frozen factor; the device side is :func:`fedsync.clients.app.train_task` (decode,
train on digits, encode) with hand-built Flower messages, as in ``test_client_state``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict

from fedsync import protocol
from fedsync.clientapp.ab_training import FactoredModel, FactorTaskError, decode_frozen
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.engine import AggregationEngine, InFlight
from fedsync.factored import factor_shapes, frozen_specs, split, uplink_specs
from fedsync.models.training import train as train_model
from fedsync.protocol import TrainReply, TrainTask
from fedsync.recipe import dataset_for, model_for, model_state
from fedsync.updates import TensorSpec, tensor_specs
from fedsync.wire import PayloadError
from tests.unit.test_client_state import _task_identity

__all__ = ["_task_identity"]  # the module-scoped fixture Message() needs

RUN: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "seed": 0,
    "strategy": "fedbuff",
    "buffer-size": 1,
    "server-optimizer": "sgd",
    "server-learning-rate": 1.0,
    "ab-rank": 4,
    "uplink-codec": "none+fp32",
    "downlink-kind": "full",
    "downlink-codec": "none+fp16",
}


def config(**overrides: Any) -> RunConfig:
    return RunConfig.from_run_config({**RUN, **overrides})


def engine(**overrides: Any) -> AggregationEngine:
    run = config(**overrides)
    return AggregationEngine(run, model_state(model_for(run.training)))


def message(plan: InFlight, run: RunConfig, *, factors: bytes | None = None) -> Message:
    task = TrainTask.for_run(
        run,
        payload=plan.downlink.payload,
        downlink_kind=plan.downlink.kind,
        version=plan.version,
        uplink_codec=plan.uplink_spec,
        task_seed=plan.seed,
        job="job-ab",
        ab_side=plan.ab_side,
        factors=plan.factors if factors is None else factors,
    )
    msg = Message(task.to_record(), dst_node_id=1, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = plan.task_id
    return msg


def context(node: dict[str, Any] | None = None, **overrides: Any) -> Context:
    return Context(
        run_id=7,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 3, **(node or {})},
        state=RecordDict(),
        run_config={**RUN, **overrides},
    )


def reply(plan: InFlight, run: RunConfig, **overrides: Any) -> TrainReply:
    ctx = context(**overrides)
    out = train_task(message(plan, run), ctx, ClientRuntime.from_context(ctx))
    return TrainReply.from_record(out.content)


# --- the factored form ---------------------------------------------------------------------
def test_only_matrices_worth_factoring_are_factored() -> None:
    specs = {
        "big.weight": TensorSpec("big.weight", (64, 256)),
        "conv.weight": TensorSpec("conv.weight", (32, 16, 3, 3)),
        "small.weight": TensorSpec("small.weight", (10, 8)),
        "bias": TensorSpec("bias", (64,)),
    }
    shapes = factor_shapes(specs, rank=4, min_rate=2.0)
    assert set(shapes) == {"big.weight", "conv.weight"}
    assert (shapes["conv.weight"].m, shapes["conv.weight"].n) == (32, 144)
    # a rank above a tensor's dimensions is capped by them, then the rule decides
    assert factor_shapes(specs, rank=64, min_rate=1.0) == {}
    up = uplink_specs(specs, shapes, "A")
    assert up["big.weight"].shape == (64, 4) and up["bias"].shape == (64,)
    assert frozen_specs(shapes, "A")["conv.weight"].shape == (4, 144)


def test_the_frozen_factors_are_the_top_singular_subspaces() -> None:
    weight = torch.randn(40, 3, 3, 3, generator=torch.Generator().manual_seed(0))
    shape = factor_shapes({"w": TensorSpec("w", tuple(weight.shape))}, 5, 1.0)["w"]
    a, b = split(weight, shape)
    assert a.shape == (40, 5) and b.shape == (5, 27)
    eye = torch.eye(5)
    assert torch.allclose(a.T @ a, eye, atol=1e-5) and torch.allclose(b @ b.T, eye, atol=1e-5)
    # projecting onto them keeps the best rank-5 approximation (Eckart-Young)
    matrix = weight.reshape(40, 27)
    best = a @ (a.T @ matrix @ b.T) @ b
    singular = torch.linalg.svdvals(matrix.double())
    error = torch.linalg.matrix_norm((best - matrix).double())
    assert math.isclose(float(error), float(singular[5:].square().sum().sqrt()), rel_tol=1e-4)


# --- a task's round trip ---------------------------------------------------------------------
def test_the_server_rebuilds_exactly_the_change_the_device_trained() -> None:
    run = config()
    server = engine()
    before = {name: t.clone() for name, t in server.trained.items()}
    plan = server.plan_task(node_id=1, number=1)
    assert plan.ab_side == "A" and plan.factors
    # the frozen factors the reply is rebuilt with ride on the task's record
    assert plan.frozen is not None and set(plan.frozen) == set(server.ab.shapes)  # type: ignore[union-attr]
    # what the device trains with: its decoded downlink and the frozen factors
    specs = tensor_specs(before)
    start = {n: t.to_dense() for n, t in UpdateCodec().decode(plan.downlink.payload, specs).items()}
    side, shapes, frozen = decode_frozen(
        plan.factors,
        plan.ab_side,
        specs,
        rank=run.compression.ab_rank,
        min_rate=run.compression.ab_min_rate,
    )
    model = model_for(run.training)
    model.load_state_dict(start, strict=False)
    factored = FactoredModel(model, shapes, frozen, side)
    train_model(factored, dataset_for(run.training).train, epochs=1, max_steps=5, lr=0.1)
    changed = {n: w.detach() - start[n] for n, w in factored.weights().items()}
    deltas = factored.factor_deltas()
    update = {n: deltas.get(n, model.state_dict()[n] - start[n]) for n in specs}
    payload = UpdateCodec(plan.uplink_spec, specs=uplink_specs(specs, shapes, side)).encode(update)
    server.arrived(plan, len(payload))
    verdict = server.receive(plan, payload, num_examples=100)
    assert verdict.status == "aggregated"
    for name in shapes:
        step = server.trained[name] - before[name]
        assert torch.allclose(step, changed[name], atol=1e-6, rtol=0), name
        assert float(step.abs().max()) > 1e-4  # it did train
    for name in set(specs) - set(shapes):
        assert torch.allclose(server.trained[name] - before[name], update[name], atol=1e-7)


def test_a_node_sends_only_the_factor_it_trained() -> None:
    run = config()
    server = engine()
    specs = server.specs
    shapes = server.ab.shapes if server.ab is not None else {}
    assert shapes  # the MLP's hidden and output weights
    sizes = {}
    for number in (1, 2):  # alternate: task 1 trains A, task 2 trains B
        plan = server.plan_task(node_id=1, number=number)
        answer = reply(plan, run)
        assert not answer.malformed
        expected = uplink_specs(specs, shapes, plan.ab_side)  # type: ignore[arg-type]
        sizes[plan.ab_side] = len(answer.payload)
        floats = sum(s.numel for s in expected.values())
        assert len(answer.payload) < 4 * floats + 200  # fp32 values plus the frame header
        assert len(answer.payload) >= 4 * floats
        server.arrived(plan, len(answer.payload))
        assert server.receive(plan, answer.payload, answer.num_examples).status == "aggregated"
    dense = 4 * sum(s.numel for s in specs.values())
    assert sizes["A"] < dense / 4 and sizes["B"] < dense / 4
    described = server.describe()["ab_training"]
    # K = 1: the first reply stepped the model, so the second task came from a new split
    assert described["tasks"] == {"A": 1, "B": 1} and described["splits"] == 2


def test_refactoring_follows_the_version() -> None:
    server = engine(**{"ab-refactor-every": 2, "ab-schedule": "version"})
    assert server.ab is not None
    sides = []
    for number in range(1, 6):
        plan = server.plan_task(node_id=1, number=number)
        sides.append(plan.ab_side)
        server.forget(plan)
        server.version += 1  # as if an aggregation happened
    assert sides == ["A", "B", "A", "B", "A"]
    assert server.ab.splits == 3  # versions 0-1, 2-3, 4


# --- bad input -------------------------------------------------------------------------------
def test_a_factor_of_the_wrong_shape_is_rejected_and_the_model_untouched() -> None:
    run = config()
    server = engine()
    before = {name: t.clone() for name, t in server.trained.items()}
    first = server.plan_task(node_id=1, number=1)  # side A
    second = server.plan_task(node_id=2, number=2)  # side B
    answer = reply(second, run)  # a B-shaped reply ...
    server.arrived(first, len(answer.payload))
    verdict = server.receive(first, answer.payload, 100)  # ... to the A task
    assert verdict.status == "rejected" and verdict.kind.startswith("decode:")
    for name, tensor in before.items():
        assert torch.equal(server.trained[name], tensor)


def test_a_nan_in_a_factor_is_rejected_and_the_model_untouched() -> None:
    run = config()
    server = engine()
    before = {name: t.clone() for name, t in server.trained.items()}
    plan = server.plan_task(node_id=1, number=1)
    # the deployment tests' faulty node: a well-formed frame with one NaN value
    ctx = context(node={"fault": "nan"})
    out = train_task(message(plan, run), ctx, ClientRuntime.from_context(ctx))
    answer = TrainReply.from_record(out.content)
    server.arrived(plan, len(answer.payload))
    verdict = server.receive(plan, answer.payload, 100)
    assert verdict.status == "rejected" and verdict.kind == "decode:NonFiniteUpdate"
    for name, tensor in before.items():
        assert torch.equal(server.trained[name], tensor)


def test_a_node_refuses_factors_that_do_not_fit_its_model() -> None:
    run = config()
    server = engine()
    plan = server.plan_task(node_id=1, number=1)
    name, shape = next(iter(server.ab.shapes.items())) if server.ab else ("", None)
    assert shape is not None
    wrong = {n: torch.zeros(s.shape) for n, s in frozen_specs(server.ab.shapes, "A").items()}  # type: ignore[union-attr]
    wrong[name] = torch.zeros(shape.rank + 1, shape.n)
    bad = UpdateCodec("none+fp16").encode(wrong)
    ctx = context()
    with pytest.raises(PayloadError, match=name.replace(".", r"\.")):
        train_task(message(plan, run, factors=bad), ctx, ClientRuntime.from_context(ctx))
    with pytest.raises(FactorTaskError, match="ab-rank = 0"):
        decode_frozen(plan.factors, "A", server.specs, rank=0, min_rate=2.0)


def test_a_task_names_a_side_only_with_factors() -> None:
    run = config()
    plan = engine().plan_task(node_id=1, number=1)
    record = message(plan, run).content
    assert TrainTask.from_record(record).factors == plan.factors
    del record.array_records[protocol.DOWNLINK][protocol.FACTORS]
    with pytest.raises(ValueError, match="ab-side"):
        TrainTask.from_record(record)


def test_settings_that_cannot_work_fail_at_start() -> None:
    with pytest.raises(SettingsError, match=r"\+ef"):
        config(**{"uplink-codec": "topk:{density}+uniform:{bits}+ef"})
    with pytest.raises(SettingsError, match="prune-at-version"):
        config(**{"prune-at-version": 2})
    with pytest.raises(SettingsError, match="fedavg"):
        config(strategy="fedavg")
    with pytest.raises(SettingsError, match="factors no tensor"):
        engine(**{"ab-rank": 1000})
