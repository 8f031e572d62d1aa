"""The async loop end to end, on a fake in-process Grid with a ClientApp-like function.

The fake Grid implements ``push_messages`` / ``pull_messages`` / ``get_node_ids`` as
Flower 1.39's does (message ids set on push, replies keyed by ``reply_to_message_id``,
non-blocking pulls) and releases each reply after a random number of polls, so the
*real* arrival order is scrambled. The "client" decodes the downlink, moves its model
halfway towards a per-node target and sends the delta back through a dense stand-in
codec (the real codec is tested on its own). The global model should head for the mean
of the targets; its "accuracy" is ``1 / (1 + squared distance)``.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedsync.serverapp.channel as channel
from fedsync import protocol
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig, SettingsError
from fedsync.reports import RunRecorder, read_events
from fedsync.serverapp.checkpoint import AsyncCheckpoint
from fedsync.serverapp.run import AsyncResult, run_async
from fedsync.updates import SparseTensor, SparseUpdate, TensorSpec
from fedsync.wire import UnexpectedCodec

SHAPES = {"layer.weight": (32, 16), "layer.bias": (16,)}


# --- a dense stand-in for fedsync.codecs.UpdateCodec (tests only) ----------------------------
SPEC_KEY = "__spec__"
"""The ``.npz`` entry holding the spec a :class:`DenseCodec` payload was encoded with."""


class DenseCodec:
    """Every value as float32 in an ``.npz``, with the codec's spec (as a real frame
    carries it); ``decode`` checks the spec (``own_spec_only``), names and shapes."""

    def __init__(self, spec: str) -> None:
        if "invalid" in spec:
            raise ValueError(f"bad spec {spec!r}")
        self.spec = spec

    def encode(self, update: Mapping[str, torch.Tensor]) -> bytes:
        buffer = io.BytesIO()
        arrays: dict[str, Any] = {k: v.detach().float().numpy() for k, v in update.items()}
        arrays[SPEC_KEY] = np.array(self.spec)
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    def decode(
        self,
        payload: bytes,
        expected: Mapping[str, TensorSpec],
        *,
        device: Any = "cpu",
        own_spec_only: bool = False,
    ) -> SparseUpdate:
        try:
            arrays = dict(np.load(io.BytesIO(payload), allow_pickle=False))
        except Exception as err:
            raise ValueError(f"not an npz payload: {err}") from err
        sent = str(arrays.pop(SPEC_KEY, ""))
        if own_spec_only and sent != self.spec:
            raise UnexpectedCodec("another codec", field="codec", expected=self.spec, got=sent)
        if set(arrays) != set(expected):
            raise ValueError(f"tensors {sorted(arrays)} != {sorted(expected)}")
        update = {}
        for name, spec in expected.items():
            array = arrays[name]
            if tuple(array.shape) != tuple(spec.shape):
                raise ValueError(f"{name}: shape {array.shape} != {spec.shape}")
            values = torch.from_numpy(array.astype(np.float32).reshape(-1)).to(device)
            update[name] = SparseTensor(spec, torch.arange(values.numel(), device=device), values)
        return update


def targets_for(node: int) -> dict[str, torch.Tensor]:
    """A common optimum plus a little per-node heterogeneity."""
    common = torch.Generator().manual_seed(12345)
    own = torch.Generator().manual_seed(node)
    return {
        k: torch.randn(shape, generator=common) + 0.2 * torch.randn(shape, generator=own)
        for k, shape in SHAPES.items()
    }


class FakeClients:
    """A ClientApp-like function: one model per node, replies per node behaviour."""

    def __init__(
        self,
        behaviour: Mapping[int, str] | None = None,
        *,
        real: bool = False,
        partitions: Mapping[int, int] | None = None,
    ) -> None:
        self.behaviour = dict(behaviour or {})
        self.partitions = dict(partitions or {})  # node -> partition-id (probe answers)
        self.real = real  # the real fedsync.codecs.UpdateCodec instead of the stand-in
        self.feedback: dict[int, dict[str, np.ndarray]] = {}
        self.models: dict[int, dict[str, torch.Tensor]] = {}
        self.configs: list[dict[str, Any]] = []
        self.wall = np.random.default_rng()

    def __call__(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if message.metadata.message_type == MessageType.QUERY:
            if node not in self.partitions:  # a ClientApp without a query handler
                return Message(Error(code=2, reason="no query handler"), reply_to=message)
            profile = protocol.NodeProfile(
                self.partitions[node], device="cpu", device_class=f"class-{node % 2}"
            )
            return Message(profile.to_record(), reply_to=message)
        mode = self.behaviour.get(node, "ok")
        if mode == "silent":
            return None
        if mode == "error":
            return Message(Error(code=2, reason="ClientApp raised"), reply_to=message)
        config: dict[str, Any] = dict(message.content.config_records[protocol.CONFIG])
        self.configs.append({"node": node, **config})
        downlink = message.content.array_records[protocol.DOWNLINK]
        payload = downlink[protocol.PAYLOAD].numpy().tobytes()
        specs = {k: TensorSpec(k, s) for k, s in SHAPES.items()}
        spec = str(config[protocol.UPLINK_CODEC])
        codec: Any = DenseCodec(spec)
        if self.real:
            codec = UpdateCodec(spec, seed=int(config[protocol.TASK_SEED]))
            if node in self.feedback:
                codec.load_state(self.feedback[node])
        decoded = {k: t.to_dense() for k, t in codec.decode(payload, specs).items()}
        if config[protocol.DOWNLINK_KIND] == "delta":
            start = {k: self.models[node][k] + decoded[k] for k in SHAPES}
        else:
            start = decoded
        self.models[node] = start
        identity = self.partitions.get(node, node)  # what a real client's data depends on
        target = targets_for(identity)
        delta = {k: 0.5 * (target[k] - start[k]) for k in SHAPES}
        if mode == "nan":
            delta["layer.bias"][0] = float("nan")
        if mode == "shape":
            delta["layer.bias"] = torch.zeros(5)  # a shape the model does not have
        body = codec.encode(delta) if mode != "garbage" else b"\x00garbage\xff" * 7
        if mode == "codec":  # a valid payload, of another codec than the task assigned
            other = UpdateCodec("none+fp32") if self.real else DenseCodec(f"not {spec}")
            body = other.encode(delta)
        if self.real:
            self.feedback[node] = codec.to_state()
        examples = 10 * (1 + identity % 3)
        metrics = MetricRecord(
            {
                protocol.NUM_EXAMPLES: examples,
                protocol.NUM_STEPS: 2,
                protocol.TRAIN_LOSS: float(sum((d**2).sum() for d in delta.values())),
                protocol.COMPUTE_SECONDS: float(self.wall.random()),  # real: varies per run
                protocol.UPLINK_BYTES: len(body),
            }
        )
        uplink = ArrayRecord({protocol.PAYLOAD: Array(np.frombuffer(body, np.uint8).copy())})
        content = RecordDict({protocol.UPLINK: uplink, protocol.METRICS: metrics})
        return Message(content, reply_to=message)


class FakeGrid:
    """Flower's Grid surface, in process; replies come back after 0..max_delay polls."""

    def __init__(
        self,
        node_ids: Iterable[int],
        client: Callable[[Message], Message | None],
        *,
        seed: int = 0,
        max_delay: int = 4,
        push_fail: Iterable[int] = (),
    ) -> None:
        self.node_ids = list(node_ids)
        self.client = client
        self.rng = np.random.default_rng(seed)
        self.max_delay = max_delay
        self.push_fail = set(push_fail)
        self.polls = 0
        self.counter = 0
        self.pending: dict[str, tuple[int, Message | None]] = {}
        self.max_in_flight = 0
        self.pull_order: list[int] = []
        self.queries: set[str] = set()

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            if message.metadata.dst_node_id in self.push_fail:
                ids.append("")
                continue
            self.counter += 1
            message_id = f"msg-{self.counter}"
            message.metadata.__dict__["_message_id"] = message_id
            release = self.polls + int(self.rng.integers(0, self.max_delay + 1))
            self.pending[message_id] = (release, self.client(message))
            if message.metadata.message_type == MessageType.QUERY:
                self.queries.add(message_id)
            ids.append(message_id)
        train = [m for m, (_, r) in self.pending.items() if m not in self.queries]
        self.max_in_flight = max(self.max_in_flight, len(train))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        self.polls += 1
        wanted = set(message_ids)
        ready = [
            mid
            for mid, (release, reply) in self.pending.items()
            if mid in wanted and release <= self.polls and reply is not None
        ]
        self.rng.shuffle(ready)
        replies = []
        for mid in ready:
            _, reply = self.pending.pop(mid)
            assert reply is not None
            if mid not in self.queries:
                self.pull_order.append(reply.metadata.src_node_id)
            replies.append(reply)
        return replies


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flower sets these in a ServerApp process; Message() needs them.
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def initial_state() -> dict[str, torch.Tensor]:
    state = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    state["bn.num_batches_tracked"] = torch.tensor(7)  # not trained, passed through
    return state


def make_evaluate(
    nodes: Iterable[int],
) -> Callable[[int, dict[str, torch.Tensor]], dict[str, float]]:
    """Distance to the mean of the nodes' targets (their common optimum)."""
    mean = {k: torch.stack([targets_for(n)[k] for n in nodes]).mean(0) for k in SHAPES}

    def evaluate(version: int, state: dict[str, torch.Tensor]) -> dict[str, float]:
        squared = sum(float(((state[k] - mean[k]) ** 2).sum()) for k in SHAPES)
        loss = squared / sum(mean[k].numel() for k in SHAPES)  # mean squared distance
        return {"loss": loss, "accuracy": 1.0 / (1.0 + 10.0 * loss)}

    return evaluate


NODES = list(range(101, 111))


def run(
    tmp_path: Path,
    name: str,
    *,
    nodes: list[int] = NODES,
    behaviour: Mapping[int, str] | None = None,
    grid_seed: int = 0,
    push_fail: Iterable[int] = (),
    real_codec: bool = False,
    partitions: Mapping[int, int] | None = None,
    **overrides: Any,
) -> tuple[AsyncResult, list[dict[str, Any]], FakeGrid, FakeClients]:
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "concurrency": 4,
        "buffer_size": 2,
        "max_aggregations": 12,
        "eval_every": 3,
        "fleet": "digits-stragglers",
        "seed": 5,
        "max_retries": 2,
        "uplink_codec": "dense-standin",
        "downlink_codec": "dense-standin",
        "plots": False,  # matplotlib costs ~1 s a run; one test draws them
    }
    settings.update(overrides)
    config = RunConfig.of(**settings)
    clients = FakeClients(behaviour, real=real_codec, partitions=partitions)
    grid = FakeGrid(nodes, clients, seed=grid_seed, push_fail=push_fail)
    recorder = RunRecorder(tmp_path, name)
    try:
        result = run_async(
            grid,  # type: ignore[arg-type]
            config,
            recorder=recorder,
            global_state=initial_state(),
            evaluate_fn=make_evaluate([(partitions or {}).get(n, n) for n in nodes]),
            codec_factory=None if real_codec else DenseCodec,
            sleep=lambda _: None,
        )
    finally:
        recorder.close()
    return result, list(read_events(recorder.events_path)), grid, clients


def with_stop(config: RunConfig, **stop: Any) -> RunConfig:
    """``config`` with other stop settings (a longer run of the same job)."""
    return dataclasses.replace(config, stop=dataclasses.replace(config.stop, **stop))


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def unfinished(events: list[dict[str, Any]]) -> int:
    """Tasks dispatched whose end (an arrival, an error or a drop) the log never shows."""
    ended = {e["task"] for e in events if e["event"] in ("arrival", "error", "drop")}
    return len({e["task"] for e in of(events, "dispatch")} - ended)


def without_wall(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if not k.startswith("wall")} for e in events]


# --- the tests -----------------------------------------------------------------------------
def test_fedbuff_run_converges_and_reports(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "fedbuff", plots=True)
    assert result.version == 12 and result.summary["stop_reason"] == "max-aggregations"
    accuracy = [e["accuracy"] for e in result.evaluations]
    assert accuracy[-1] > accuracy[0] + 0.5
    assert [e["version"] for e in result.evaluations] == [0, 3, 6, 9, 12]
    assert torch.equal(result.global_state["bn.num_batches_tracked"], torch.tensor(7))
    summary = json.loads((tmp_path / "fedbuff" / "summary.json").read_text())
    assert summary["final_accuracy"] == pytest.approx(accuracy[-1])
    assert summary["total_bytes_up"] == sum(e["bytes_up"] for e in of(events, "arrival"))
    assert summary["total_bytes_down"] == sum(e["bytes_down"] for e in of(events, "dispatch"))
    assert summary["total_bytes_down"] > 0 and summary["total_bytes_up"] > 0
    assert sum(summary["staleness_histogram"].values()) == summary["aggregated_updates"] == 24
    assert summary["tasks_in_flight_at_end"] == unfinished(events) > 0
    for png in ("accuracy.png", "accuracy_vs_time.png", "accuracy_vs_bytes.png"):
        assert (tmp_path / "fedbuff" / png).stat().st_size > 0
    evaluation = of(events, "evaluation")[-1]
    assert {"accuracy", "loss", "sim_time", "cumulative_bytes_up", "cumulative_bytes_down"} <= set(
        evaluation
    )


def test_exactly_k_updates_per_aggregation(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "k3", buffer_size=3, concurrency=7)
    aggregations = of(events, "aggregation")
    assert len(aggregations) == result.version == 12
    assert all(a["updates"] == 3 for a in aggregations)
    # between two aggregations exactly K accepted arrivals (no stale drops here)
    accepted = 0
    for event in events:
        if event["event"] == "arrival":
            accepted += 1
        elif event["event"] == "aggregation":
            assert accepted == 3
            accepted = 0


def test_never_more_than_c_in_flight(tmp_path: Path) -> None:
    _, events, grid, _ = run(tmp_path, "c3", concurrency=3, buffer_size=2)
    assert grid.max_in_flight <= 3
    in_flight = 0
    for event in events:
        if event["event"] == "dispatch":
            in_flight += 1
            assert in_flight <= 3
            assert event["in_flight"] <= 3
        elif event["event"] in ("arrival", "error") or (
            event["event"] == "drop" and event["reason"] in ("dropout", "offline")
        ):
            in_flight -= 1
    assert max(e["in_flight"] for e in of(events, "dispatch")) == 3


def test_same_seed_same_event_log_whatever_the_real_order(tmp_path: Path) -> None:
    _, first, grid_a, _ = run(tmp_path, "a", grid_seed=1, concurrency=6)
    _, second, grid_b, _ = run(tmp_path, "b", grid_seed=2, concurrency=6)
    assert grid_a.pull_order != grid_b.pull_order  # the real arrival order differed
    assert without_wall(first) == without_wall(second)
    _, other_seed, _, _ = run(
        tmp_path, "c", grid_seed=1, concurrency=6, fleet_assignment="random", seed=9
    )
    assert without_wall(other_seed) != without_wall(first)


def test_same_partitions_same_run_whatever_node_ids_flower_draws(tmp_path: Path) -> None:
    """Flower draws random node ids in every simulation; the probe's partition ids
    keep fleet assignment, application order and seeds the same."""
    rng = np.random.default_rng(0)
    ids_a = [int(x) for x in rng.integers(1, 2**62, size=10)]
    ids_b = [int(x) for x in rng.integers(1, 2**62, size=10)]
    part_a = {n: i for i, n in enumerate(ids_a)}
    part_b = {n: i for i, n in enumerate(ids_b)}
    assert sorted(ids_a, key=part_a.__getitem__) != sorted(ids_a)  # id order != partitions
    common: dict[str, Any] = {"concurrency": 5, "fleet": "edge-mixed", "max_aggregations": 15}
    _, first, _, _ = run(tmp_path, "ids-a", nodes=ids_a, partitions=part_a, **common)
    _, second, _, _ = run(tmp_path, "ids-b", nodes=ids_b, partitions=part_b, grid_seed=3, **common)

    def stable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        drop = ("node", "node_of_device")
        return [{k: v for k, v in e.items() if k not in drop} for e in without_wall(events)]

    for a, b in zip(stable(first), stable(second), strict=True):
        assert a == b
    assert of(first, "async_start")[0]["node_of_device"] == ids_a


def test_nodes_without_a_probe_answer_go_by_node_id(tmp_path: Path) -> None:
    nodes = [50, 10, 40, 20, 30]
    _, events, _, _ = run(tmp_path, "partial", nodes=nodes, partitions={40: 0, 50: 1})
    assert of(events, "async_start")[0]["node_of_device"] == [40, 50, 10, 20, 30]
    _, events, _, _ = run(tmp_path, "no-probe", nodes=nodes, probe_timeout=0.0)
    assert of(events, "async_start")[0]["node_of_device"] == [10, 20, 30, 40, 50]


def test_arrivals_follow_simulated_time_not_real_time(tmp_path: Path) -> None:
    _, events, grid, _ = run(tmp_path, "order", concurrency=10, buffer_size=3, max_aggregations=40)
    times = [e["sim_time"] for e in events if "sim_time" in e]
    assert times == sorted(times)  # every event, of every kind, in simulated order
    arrival_nodes = [e["node"] for e in of(events, "arrival")]
    assert arrival_nodes != grid.pull_order[: len(arrival_nodes)]
    # stragglers (the 3 largest node ids, by fleet order) arrive late: higher sim durations
    durations: dict[str, list[float]] = {}
    for e in of(events, "arrival"):
        kind = "straggler" if e["node"] >= NODES[7] else "ordinary"
        durations.setdefault(kind, []).append(e["sim_duration"])
    assert min(durations["straggler"]) > max(durations["ordinary"])


def test_error_replies_are_retried_then_the_device_is_given_up(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "errors", behaviour={103: "error"}, max_retries=2)
    errors = [e for e in of(events, "error") if e["node"] == 103]
    assert len(errors) == 3  # the first try and two retries
    assert [e["gave_up"] for e in errors] == [False, False, True]
    assert [e["node"] for e in of(events, "give-up")] == [103]
    assert not [e for e in of(events, "dispatch") if e["node"] == 103][3:]
    summary = result.summary
    assert summary["errors"] == {"clientapp-exception": 3}
    assert summary["devices_given_up"] == [103]
    assert summary["stop_reason"] == "max-aggregations"


def test_run_ends_when_every_device_is_given_up(tmp_path: Path) -> None:
    behaviour = dict.fromkeys(NODES[:4], "error")
    result, events, _, _ = run(
        tmp_path, "all-bad", nodes=NODES[:4], behaviour=behaviour, max_retries=1
    )
    assert result.summary["stop_reason"] == "no-devices-left"
    assert result.version == 0 and len(of(events, "error")) == 8
    assert torch.equal(result.global_state["layer.weight"], torch.zeros(SHAPES["layer.weight"]))
    # The summary says why, naming the one error every device failed with.
    assert result.summary["failure"] == (
        "the run ended at v0: every device was given up after repeated failures (4 "
        "device(s)); every one failed with the same error: clientapp-exception (code 2): "
        "ClientApp raised"
    )


@pytest.mark.parametrize("mode", ["garbage", "nan", "shape"])
def test_bad_replies_are_rejected_and_never_aggregated(tmp_path: Path, mode: str) -> None:
    nodes = NODES[:3]
    result, events, _, _ = run(
        tmp_path, mode, nodes=nodes, behaviour=dict.fromkeys(nodes, mode), max_retries=1
    )
    rejected = [e for e in of(events, "drop") if e["reason"] == "rejected"]
    assert len(rejected) == 6 and result.summary["drops"] == {"rejected": 6}
    assert result.summary["stop_reason"] == "no-devices-left"
    assert result.version == 0 and not of(events, "aggregation")
    assert torch.equal(result.global_state["layer.weight"], torch.zeros(SHAPES["layer.weight"]))
    assert torch.equal(result.global_state["layer.bias"], torch.zeros(SHAPES["layer.bias"]))


def test_one_bad_device_does_not_touch_the_model(tmp_path: Path) -> None:
    clean, _, _, _ = run(tmp_path, "clean", nodes=NODES[:4], max_aggregations=6)
    mixed, events, _, _ = run(
        tmp_path,
        "mixed",
        nodes=[*NODES[:4], 999],
        behaviour={999: "nan"},
        max_aggregations=6,
        max_retries=0,
    )
    assert [e["node"] for e in of(events, "give-up")] == [999]
    assert mixed.summary["drops"]["rejected"] == 1
    assert mixed.summary["final_accuracy"] > mixed.evaluations[0]["accuracy"]
    assert torch.isfinite(mixed.global_state["layer.bias"]).all()
    assert clean.version == mixed.version == 6


def test_stale_updates_are_dropped_and_counted(tmp_path: Path) -> None:
    result, events, _, _ = run(
        tmp_path, "stale", concurrency=8, buffer_size=1, max_staleness=0, max_aggregations=10
    )
    stale = [e for e in of(events, "drop") if e["reason"] == "stale"]
    assert stale and result.summary["drops"]["stale"] == len(stale)
    assert all(e["staleness"] > 0 for e in stale)
    assert set(result.summary["staleness_histogram"]) == {"0"}
    assert result.version == 10


def test_fedasync_applies_each_update_at_once(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "fedasync", strategy="fedasync", fedasync_alpha=0.5)
    aggregations = of(events, "aggregation")
    assert all(a["updates"] == 1 for a in aggregations)
    assert len(of(events, "arrival")) == len(aggregations) == 12
    # weight = alpha * s(staleness) with polynomial 0.5
    for arrival, aggregation in zip(of(events, "arrival"), aggregations, strict=True):
        expected = 0.5 * (1 + arrival["staleness"]) ** -0.5
        assert aggregation["weight_sum"] == pytest.approx(expected, rel=1e-6)
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"]


def test_teasq_decays_compression_and_weights_by_examples(tmp_path: Path) -> None:
    result, events, _, clients = run(
        tmp_path,
        "teasq",
        strategy="teasq",
        uplink_codec="topk:{density}+uniform:{bits}+ef",
        density_start=0.2,
        density_floor=0.02,
        density_decay=0.3,
        bits_start=8,
        bits_floor=4,
        bits_decay=0.1,
        max_aggregations=15,
    )
    specs = [e["uplink_codec"] for e in of(events, "dispatch")]
    assert specs[0] == "topk:0.2+uniform:8+ef"
    densities = [float(s.split("+")[0].split(":")[1]) for s in specs]
    assert densities[-1] < densities[0]
    assert clients.configs[0][protocol.UPLINK_CODEC] == specs[0]
    assert {c[protocol.MODEL_VERSION] for c in clients.configs} >= {0, 1}
    weights = [a["weight_sum"] for a in of(events, "aggregation")]
    assert max(weights) > 2  # weighted by num-examples (10..30), not by staleness alone
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"]


def test_delta_downlink_keeps_replicas_and_falls_back_to_full(tmp_path: Path) -> None:
    """With the real, lossy codec (top-k 10 %, 8-bit) every device's model equals, bit
    for bit, the server's copy of it: what the codec left out stays on the server."""
    result, events, _, clients = run(
        tmp_path,
        "delta",
        real_codec=True,
        uplink_codec="topk:{density}+uniform:{bits}+ef",
        downlink_codec="none+fp16",
        downlink_kind="delta",
        downlink_delta_codec="topk:0.1+uniform:8",
        downlink_max_lag=1.0,  # let the lossy deltas through: equality is the point here
        max_aggregations=9,
    )
    kinds: dict[int, list[str]] = {}
    for e in of(events, "dispatch"):
        kinds.setdefault(e["node"], []).append(e["downlink_kind"])
    assert all(k[0] == "full" for k in kinds.values())
    assert any("delta" in k for k in kinds.values())
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"]
    # the lag (what a device trains without) is reported, and top-k 10 % leaves some
    lags = [e["downlink_lag"] for e in of(events, "dispatch") if e["downlink_kind"] == "delta"]
    assert lags and 0.0 < max(lags) < 1.0
    downlink = result.engine.downlink
    assert set(clients.models) == set(kinds)
    for node, model in clients.models.items():
        held = downlink.holds(node)
        assert held is not None, f"node {node}: the server lost track of its model"
        for name in SHAPES:
            assert torch.equal(model[name], held[name]), f"node {node}, {name}"
    # and the global model moved on past every replica: the residual is real
    assert any(
        not torch.equal(result.global_state[name], downlink.holds(node)[name])  # type: ignore[index]
        for node in clients.models
        for name in SHAPES
    )


def test_a_delta_that_leaves_too_much_behind_is_replaced_by_the_full_model(
    tmp_path: Path,
) -> None:
    result, events, _, clients = run(
        tmp_path,
        "resync",
        real_codec=True,
        uplink_codec="topk:{density}+uniform:{bits}+ef",
        downlink_codec="none+fp16",
        downlink_kind="delta",
        downlink_delta_codec="topk:0.01+uniform:2",  # far too coarse for these changes
        downlink_max_lag=0.05,
        max_aggregations=6,
    )
    dispatched = of(events, "dispatch")
    assert {e["downlink_kind"] for e in dispatched} == {"full"}
    assert result.summary["downlink_resyncs"] > 0
    downlink = result.engine.downlink
    for node, model in clients.models.items():  # still exactly what the server expects
        held = downlink.holds(node)
        assert held is not None and all(torch.equal(model[n], held[n]) for n in SHAPES)


def test_offline_and_dropout_losses_are_counted_not_retired(tmp_path: Path) -> None:
    fleet = tmp_path / "flaky.toml"
    fleet.write_text(
        'name = "flaky"\n'
        "[[group]]\ncount = 5\ndropout = 0.3\nseconds-per-sample = 0.01\n"
        "[[group]]\ncount = 5\nonline-seconds = 2\noffline-seconds = 2\n"
        'offline-behavior = "drop"\nseconds-per-sample = 0.01\n'
    )
    result, events, _, _ = run(tmp_path, "flaky", fleet=str(fleet), max_retries=0)
    drops = result.summary["drops"]
    assert drops.get("dropout", 0) > 0
    assert drops.get("dropout", 0) + drops.get("offline", 0) == len(
        [e for e in of(events, "drop") if e["reason"] in ("dropout", "offline")]
    )
    assert result.summary["devices_given_up"] == []
    assert result.version == 12
    assert result.summary["tasks_in_flight_at_end"] == unfinished(events)


def test_failed_push_and_silent_nodes_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "TTL_GRACE_S", 0.0)
    result, events, _, _ = run(
        tmp_path,
        "lost",
        behaviour={102: "silent"},
        push_fail=[101],
        task_ttl=0.5,  # generous: only the silent node may expire, even on a loaded machine
        max_retries=1,
        max_aggregations=4,
    )
    reasons = {e["node"]: e["reason"] for e in of(events, "error")}
    assert reasons[101].startswith("push-failed")
    assert reasons[102].startswith("ttl-expired")
    assert sorted(result.summary["devices_given_up"]) == [101, 102]
    assert result.summary["errors"] == {"push-failed": 2, "ttl-expired": 2}
    assert result.version == 4


def test_resume_from_a_checkpoint(tmp_path: Path) -> None:
    saved: list[AsyncCheckpoint] = []
    nodes = NODES[:5]
    config = RunConfig.of(
        strategy="fedbuff",
        server_optimizer="momentum",
        server_learning_rate=0.5,
        max_aggregations=4,
        eval_every=2,
        checkpoint_every=0,  # 0: a checkpoint at every evaluation
        uplink_codec="x",
        downlink_codec="x",
        plots=False,
    )
    recorder = RunRecorder(tmp_path, "first")
    first = run_async(
        FakeGrid(nodes, FakeClients()),  # type: ignore[arg-type]
        config,
        recorder=recorder,
        global_state=initial_state(),
        evaluate_fn=make_evaluate(nodes),
        codec_factory=DenseCodec,
        checkpoint_fn=saved.append,
        sleep=lambda _: None,
    )
    recorder.close()
    assert [c.version for c in saved] == [0, 2, 4]
    assert saved[-1].optimizer_state["kind"] == "momentum"
    recorder = RunRecorder(tmp_path, "second")
    second = run_async(
        FakeGrid(nodes, FakeClients()),  # type: ignore[arg-type]
        with_stop(config, max_aggregations=8),
        recorder=recorder,
        global_state=initial_state(),
        evaluate_fn=make_evaluate(nodes),
        codec_factory=DenseCodec,
        resume=saved[-1],
        sleep=lambda _: None,
    )
    recorder.close()
    assert second.version == 8
    assert second.evaluations[0]["version"] == 4
    assert second.evaluations[0]["accuracy"] == pytest.approx(first.evaluations[-1]["accuracy"])
    assert second.summary["total_bytes_up"] > first.summary["total_bytes_up"]
    assert second.evaluations[0]["sim_time"] == pytest.approx(saved[-1].sim_time)


def test_wall_clock_runs_the_same_logic(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "wall", clock="wall", max_aggregations=6)
    assert result.version == 6 and result.summary["clock"]["clock"] == "wall"
    assert all(a["updates"] == 2 for a in of(events, "aggregation"))


def test_max_sim_time_stops_the_run(tmp_path: Path) -> None:
    result, events, _, _ = run(tmp_path, "short", max_sim_time=2.0, max_aggregations=1000)
    assert result.summary["stop_reason"] == "max-sim-time"
    assert all(e["sim_time"] <= 2.0 for e in events if "sim_time" in e)
    # The event popped past the limit is never handled: its task is still in flight.
    assert result.summary["tasks_in_flight_at_end"] == unfinished(events) > 0


def test_bad_codec_spec_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="codec spec 'invalid'"):
        run(tmp_path, "bad", downlink_codec="invalid")


# --- with the real codec ----------------------------------------------------------------------
REAL: dict[str, Any] = {
    "uplink_codec": "topk:{density}+uniform:{bits}+ef",
    "downlink_codec": "none+fp16",
}


def test_teasq_with_the_real_codec_and_delta_downlinks(tmp_path: Path) -> None:
    result, events, _, _ = run(
        tmp_path,
        "real",
        real_codec=True,
        strategy="teasq",
        density_start=0.5,
        density_floor=0.05,
        density_decay=0.1,
        bits_start=8,
        bits_floor=4,
        bits_decay=0.1,
        downlink_kind="delta",
        downlink_delta_codec="none+uniform:8",  # 8-bit deltas vs the fp16 full model
        max_aggregations=20,
        **REAL,
    )
    assert result.summary["drops"] == {} and result.summary["errors"] == {}
    assert result.summary["final_accuracy"] > result.evaluations[0]["accuracy"] + 0.5
    arrivals = of(events, "arrival")
    assert arrivals[-1]["bytes_up"] < arrivals[0]["bytes_up"] / 2  # density 0.5 -> ~0.1
    down = {"full": [], "delta": []}  # type: dict[str, list[int]]
    for e in of(events, "dispatch"):
        down[e["downlink_kind"]].append(e["bytes_down"])
    assert down["delta"] and max(down["delta"]) < min(down["full"])
    # bytes in the report are real payload lengths
    assert result.summary["total_bytes_down"] == sum(down["full"]) + sum(down["delta"])


def test_real_codec_garbage_is_rejected(tmp_path: Path) -> None:
    result, events, _, _ = run(
        tmp_path,
        "real-garbage",
        real_codec=True,
        behaviour={104: "garbage"},
        max_retries=0,
        max_aggregations=6,
        **REAL,
    )
    details = {e["node"]: e["detail"] for e in of(events, "drop") if e["reason"] == "rejected"}
    assert set(details) == {104} and "decode failed" in details[104]
    assert result.summary["drops"]["rejected"] == 1 and result.version == 6


@pytest.mark.parametrize("real_codec", [False, True])
def test_a_valid_reply_in_another_codec_is_a_codec_mismatch(
    tmp_path: Path, real_codec: bool
) -> None:
    """A well-formed payload of a codec the task did not assign: rejected as
    ``codec-mismatch``, counted, never aggregated; the others' run goes on."""
    nodes = NODES[:4]
    hostile = nodes[0]
    result, events, _, _ = run(
        tmp_path,
        "codec",
        nodes=nodes,
        behaviour={hostile: "codec"},
        max_retries=1,
        max_aggregations=6,
        real_codec=real_codec,
        **(REAL if real_codec else {}),
    )
    summary = result.summary
    rejected = [e for e in of(events, "drop") if e["reason"] == "rejected"]
    assert [(e["node"], e["rejection"]) for e in rejected] == [(hostile, "codec-mismatch")] * 2
    assert all("codec mismatch" in e["detail"] for e in rejected)
    assert summary["rejections"] == {"codec-mismatch": 2}
    assert summary["drops"]["rejected"] == 2
    assert summary["devices"][str(hostile)]["completed"] == 0
    assert [e["node"] for e in of(events, "give-up")] == [hostile]
    stale = summary["drops"].get("stale", 0)
    assert summary["aggregated_updates"] == summary["arrivals"] - 2 - stale
    assert result.version == 6 and summary["final_accuracy"] > result.evaluations[0]["accuracy"]


def test_downlink_codec_with_error_feedback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="must not use error feedback"):
        run(
            tmp_path,
            "ef",
            real_codec=True,
            uplink_codec="topk:0.1+uniform:8+ef",
            downlink_codec="topk:0.5+fp16+ef",
        )


def test_summary_reports_each_nodes_device_class_next_to_its_task_times(tmp_path: Path) -> None:
    nodes = [50, 10, 40, 20, 30]
    result, events, _, _ = run(
        tmp_path, "profiles", nodes=nodes, partitions={n: i for i, n in enumerate(nodes)}
    )
    devices = result.summary["devices"]
    assert set(devices) == {str(n) for n in nodes}
    for node in nodes:
        entry = devices[str(node)]
        assert entry["device"] == "cpu" and entry["device_class"] == f"class-{node % 2}"
        assert entry["device_index"] == nodes.index(node)
        durations = [
            e["sim_duration"] for e in events if e["event"] == "arrival" and e["node"] == node
        ]
        assert entry["task_seconds_median"] == pytest.approx(float(np.median(durations)))
    # A node that did not answer the probe has counters and times and an empty profile.
    result, _, _, _ = run(tmp_path, "no-profile", nodes=nodes, partitions={50: 0})
    assert result.summary["devices"]["50"]["device_class"] == "class-0"
    assert result.summary["devices"]["10"]["device_class"] == ""
    assert result.summary["devices"]["10"]["device"] == ""
    assert result.summary["devices"]["10"]["task_seconds_median"] is not None
