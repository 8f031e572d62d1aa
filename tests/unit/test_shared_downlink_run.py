"""The shared downlink end to end: the async loop, a fake Grid, devices that use the
ClientApp's own :func:`fedsync.clientapp.compressed.apply_shared_downlink`, real codecs.

One device builds another initial model than the server's (another seed): it refuses
its first task with a typed error, as a ClientApp would (Flower turns the exception
into an error reply), and the server resynchronises it with a whole model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.supercore.task_identity import TaskIdentity

from fedsync import protocol
from fedsync.clientapp.compressed import (
    CODEC_STATE,
    DOWNLINK_BASE,
    DOWNLINK_VERSION,
    InitialModelMismatch,
    MissingDownlinkBase,
    apply_shared_downlink,
)
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig
from fedsync.models.initial import state_digest
from fedsync.protocol import TrainReply, TrainTask
from fedsync.recipe import model_state
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.run import AsyncResult, run_async
from fedsync.updates import TensorSpec
from tests.unit.test_async_run import FakeGrid, make_evaluate, of, targets_for

SHAPES = {"layer.weight": (32, 16), "layer.bias": (16,)}
SPECS = {name: TensorSpec(name, shape, "float32") for name, shape in SHAPES.items()}
NODES = list(range(201, 209))
BAD_SEED = 205


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flower sets these in a ServerApp process; Message() needs them.
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def initial(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {n: 0.3 * torch.randn(s, generator=generator) for n, s in SHAPES.items()}


class SharedClients:
    """Devices of a shared-downlink run: each keeps its model in its own Flower
    ``Context``, as a SuperNode does; one (``BAD_SEED``) builds another initial model."""

    def __init__(self) -> None:
        self.contexts: dict[int, Context] = {}
        self.starts: list[tuple[int, int, dict[str, torch.Tensor]]] = []
        self.refused: list[tuple[int, str]] = []
        self.feedback: dict[int, dict[str, np.ndarray]] = {}

    def __call__(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if message.metadata.message_type == MessageType.QUERY:
            return Message(Error(code=2, reason="no query handler"), reply_to=message)
        task = TrainTask.from_record(message.content)
        context = self.contexts.setdefault(
            node, Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
        )
        try:
            start = self.start(task, context, initial(1 if node == BAD_SEED else 0))
        except MissingDownlinkBase as err:  # and its subclasses: what a ClientApp raises
            self.refused.append((node, type(err).__name__))
            reason = f"ClientApp raised: {type(err).__name__}: {err}"
            return Message(Error(code=2, reason=reason), reply_to=message)
        self.starts.append((node, task.version, start))
        codec = UpdateCodec(task.uplink_codec, seed=task.task_seed)
        if node in self.feedback:
            codec.load_state(self.feedback[node])
        target = targets_for(node)
        body = codec.encode({k: 0.5 * (target[k] - start[k]) for k in SHAPES})
        self.feedback[node] = codec.to_state()
        metrics = MetricRecord(
            {
                protocol.NUM_EXAMPLES: 10,
                protocol.NUM_STEPS: 2,
                protocol.TRAIN_LOSS: 1.0,
                protocol.COMPUTE_SECONDS: 0.1,
                protocol.UPLINK_BYTES: len(body),
            }
        )
        uplink = ArrayRecord({protocol.PAYLOAD: Array(np.frombuffer(body, np.uint8).copy())})
        content = RecordDict({protocol.UPLINK: uplink, protocol.METRICS: metrics})
        return Message(content, reply_to=message)

    def start(
        self, task: TrainTask, context: Context, own: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The task's start model on a node that builds ``own`` as its initial model."""
        return apply_shared_downlink(
            task.payload,
            SPECS,
            context,
            version=task.version,
            initial_digest=task.initial_digest,
            initial=own,
        )


def run(
    tmp_path: Path, clients: SharedClients | None = None, **overrides: Any
) -> tuple[AsyncResult, list[dict[str, Any]], SharedClients]:
    """A run of ``clients`` (default: :class:`SharedClients`) on a fake Grid; keyword
    arguments override the shared-downlink settings."""
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 4,
        "buffer_size": 2,
        "max_aggregations": 10,
        "eval_every": 5,
        "fleet": "digits-stragglers",
        "seed": 5,
        "max_retries": 2,
        "uplink_codec": "topk:0.3+uniform:8+ef",
        "downlink_kind": "shared",
        "downlink_delta_codec": "topk:0.1+uniform:8",
        "downlink_max_versions": 4,
        "downlink_max_lag": 1.0,  # no restarts: the sequence is the point here
        "downlink_seeded_start": True,
        "plots": False,
        **overrides,
    }
    clients = clients or SharedClients()
    grid = FakeGrid(NODES, clients, seed=3)
    recorder = RunRecorder(tmp_path, "shared")
    try:
        result = run_async(
            grid,  # type: ignore[arg-type]
            RunConfig.of(**settings),
            recorder=recorder,
            global_state={**initial(), "bn.num_batches_tracked": torch.tensor(3)},
            evaluate_fn=make_evaluate(NODES),
            sleep=lambda _: None,
        )
    finally:
        recorder.close()
    return result, list(read_events(recorder.events_path)), clients


def same(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in SHAPES)


def test_a_shared_run_keeps_every_device_on_one_sequence(tmp_path: Path) -> None:
    result, events, clients = run(tmp_path)
    dispatched = of(events, "dispatch")
    details = [e["downlink_detail"] for e in dispatched]
    # every device's first contact at version 0 costs nothing ...
    first: dict[int, dict[str, Any]] = {}
    for e in dispatched:
        first.setdefault(e["node"], e)
    for node, e in first.items():
        if e["version"] == 0:
            assert (e["bytes_down"], e["downlink_detail"]) == (0, "seeded"), node
    assert "changes" in details
    # ... but the device that builds another initial model refuses it, typed, and is
    # resynchronised with a whole model
    assert clients.refused == [(BAD_SEED, "InitialModelMismatch")]
    errors = [e for e in of(events, "error") if e["node"] == BAD_SEED]
    assert len(errors) == 1 and "InitialModelMismatch" in errors[0]["reason"]
    after = [e for e in dispatched if e["node"] == BAD_SEED][1]
    assert after["downlink_detail"] == "whole" and after["bytes_down"] > 0
    assert any(node == BAD_SEED for node, _, _ in clients.starts)  # it trained later
    # every device that started from a version started from the same bits
    by_version: dict[int, dict[str, torch.Tensor]] = {}
    for node, version, start in clients.starts:
        if node == BAD_SEED and version == 0:
            continue  # its whole model at version 0: the fp16 rounding of the seeded model
        assert same(start, by_version.setdefault(version, start)), (node, version)
    # and the server's mirror is what the devices at its version hold
    downlink = result.engine.downlink
    for node, context in clients.contexts.items():
        held = downlink.holds(node)
        if held is not None:
            base = context.state.array_records[DOWNLINK_BASE]
            assert all(np.array_equal(base[n].numpy(), held[n].cpu().numpy()) for n in SHAPES)
    summary = result.summary
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"]
    # bytes: per device as sent, and each change once
    assert summary["total_bytes_down"] == sum(e["bytes_down"] for e in dispatched)
    broadcast = sum(e["bytes_down_broadcast"] for e in dispatched)
    assert summary["total_bytes_down_broadcast"] == broadcast < summary["total_bytes_down"]
    shared = summary["downlink_shared"]
    assert shared["payloads"]["seeded"] >= 1 and shared["bytes_broadcast"] == broadcast
    assert shared["restarts"] == 0 and len(shared["changes_per_payload"]) > 1  # lags vary
    assert summary["downlink_resyncs"] == 0  # the refused first task is no resync
    assert "cumulative_bytes_down_broadcast" in result.evaluations[-1]


def test_without_the_seeded_start_no_device_fails_a_task_on_its_initial_model(
    tmp_path: Path,
) -> None:
    # downlink-seeded-start = false: first contacts get the whole model, so the device
    # that builds another initial model is never asked to match it
    result, events, clients = run(tmp_path, downlink_seeded_start=False, max_aggregations=4)
    assert clients.refused == [] and of(events, "error") == []
    dispatched = of(events, "dispatch")
    first: dict[int, dict[str, Any]] = {}
    for e in dispatched:
        first.setdefault(e["node"], e)
    assert all(e["downlink_detail"] == "whole" and e["bytes_down"] > 0 for e in first.values())
    assert "seeded" not in {e["downlink_detail"] for e in dispatched}
    by_version: dict[int, dict[str, torch.Tensor]] = {}
    for node, version, start in clients.starts:  # BAD_SEED's included
        assert same(start, by_version.setdefault(version, start)), (node, version)
    shared = result.summary["downlink_shared"]
    assert shared["seeded_start"] is False and "seeded" not in shared["payloads"]
    assert result.summary["downlink_resyncs"] == 0


def test_other_downlink_kinds_report_no_broadcast_figure(tmp_path: Path) -> None:
    result, events, _ = run(
        tmp_path,
        downlink_kind="delta",
        downlink_delta_codec="none+uniform:{bits}",
        downlink_seeded_start=False,
        max_aggregations=2,
    )  # every task fails (the devices expect shared frames): the fields are what counts
    summary = result.summary
    assert "total_bytes_down_broadcast" not in summary and "downlink_shared" not in summary
    assert all("bytes_down_broadcast" not in e for e in of(events, "dispatch"))
    assert all("downlink_detail" not in e for e in of(events, "dispatch"))


# --- fedsync's own ClientApp -----------------------------------------------------------------
def shared_task(digest: str) -> Message:
    """A first-contact task of a shared run at version 0: no payload, the digest."""
    train = TrainTask(
        payload=b"",
        downlink_kind="shared",
        version=0,
        uplink_codec="topk:0.1+uniform:8+ef",
        task_seed=11,
        job="job-1",
        local_epochs=1,
        local_steps=2,
        batch_size=32,
        learning_rate=0.1,
        momentum=0.9,
        proximal_mu=0.0,
        initial_digest=digest,
    )
    message = Message(train.to_record(), dst_node_id=1, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = "task-1"
    return message


def test_the_clientapp_starts_from_its_own_seeded_model() -> None:
    run_config: dict[str, bool | float | int | str] = {
        "dataset": "digits",
        "seed": 0,
        "downlink-kind": "shared",
    }

    def node() -> tuple[Context, ClientRuntime]:
        node_config: dict[str, bool | float | int | str] = {"partition-id": 1, "num-partitions": 3}
        context = Context(1, 1, node_config, RecordDict(), run_config)
        return context, ClientRuntime.from_context(context)

    context, runtime = node()
    fresh = model_state(runtime.fresh_model())  # what the server's initial_arrays are
    reply = train_task(shared_task(state_digest(fresh)), context, runtime)
    assert TrainReply.from_record(reply.content).payload  # it trained and sent an update
    assert dict(context.state.config_records[DOWNLINK_VERSION]) == {"epoch": 0, "version": 0}
    base = context.state.array_records[DOWNLINK_BASE]
    assert all(np.array_equal(base[n].numpy(), t.numpy()) for n, t in fresh.items())
    # a server whose initial model is another: refused before anything is kept
    context, runtime = node()
    with pytest.raises(InitialModelMismatch):
        train_task(shared_task("0" * 64), context, runtime)
    assert DOWNLINK_BASE not in context.state.array_records
    assert CODEC_STATE not in context.state.array_records  # no update was encoded
