"""The ClientApp's per-message timing lines (node config ``timing-log``).

:mod:`benchmarks.deploy_overhead` splits a deployed task's time with these lines; the
fields it reads are checked here, on the real ClientApp and on the mod around a stub.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsync import protocol
from fedsync.clients import timing
from fedsync.clients.app import app

# What benchmarks.deploy_overhead.split_tasks reads from a line.
BENCHMARK_FIELDS = {
    "message_type",
    "handler_start",
    "handler_end",
    "process_start",
    "imports_s",
    "data_s",
    "compute_s",
    "device",
    "device_class",
}


@pytest.fixture(autouse=True)
def _task_identity() -> Iterator[None]:
    # Flower sets these in a ClientApp process; Message() needs them.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_run_id", "_node_id", "_task_id"):
            patch.setattr(TaskIdentity, name, 1)
        yield


def _message(message_type: str, number: int) -> Message:
    content = RecordDict({protocol.CONFIG: ConfigRecord({protocol.PROBE_KEY: 1})})
    message = Message(content, dst_node_id=1, message_type=message_type)
    message.metadata.__dict__["_message_id"] = f"message-{number}"
    return message


def _context(log: Path | None) -> Context:
    node_config: dict[str, Any] = {
        "partition-id": 0,
        "num-partitions": 2,
        "device": "cpu",
        protocol.DEVICE_CLASS: "test-cpu",
    }
    if log is not None:
        node_config[timing.TIMING_LOG] = str(log)
    return Context(
        run_id=7,
        node_id=1,
        node_config=node_config,
        state=RecordDict(),
        run_config={"dataset": "digits", "seed": 0},
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _stub(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({protocol.COMPUTE_SECONDS: 0.25})
    return Message(RecordDict({protocol.METRICS: metrics}), reply_to=msg)


def test_without_a_timing_log_the_mod_only_passes_the_message_on(tmp_path: Path) -> None:
    mod = timing.phase_timing()
    calls: list[Message] = []

    def handler(msg: Message, context: Context) -> Message:
        calls.append(msg)
        return _stub(msg, context)

    message = _message(MessageType.TRAIN, 1)
    reply = mod(message, _context(None), handler)
    assert calls == [message]
    assert reply.content.metric_records[protocol.METRICS][protocol.COMPUTE_SECONDS] == 0.25
    assert list(tmp_path.iterdir()) == []


def test_one_line_per_message_the_first_one_reports_the_load(tmp_path: Path) -> None:
    log = tmp_path / "timing.jsonl"
    mod = timing.phase_timing()
    context = _context(log)
    mod(_message(MessageType.TRAIN, 1), context, _stub)
    mod(_message(MessageType.QUERY, 2), context, _stub)
    first, second = _lines(log)
    assert first.keys() >= BENCHMARK_FIELDS and second.keys() >= BENCHMARK_FIELDS
    assert (first["message_type"], second["message_type"]) == ("train", "query")
    # The first message's handler window starts where the ClientApp's load did.
    assert first["imports_s"] == pytest.approx(first["module_loaded"] - first["handler_start"])
    assert first["imports_s"] >= 0.0 and second["imports_s"] == 0.0
    assert first["handler_start"] <= first["handler_end"] <= second["handler_start"]
    assert first["compute_s"] == 0.25
    assert first["data_s"] >= 0.0 and second["data_s"] == 0.0  # a query loads no data
    assert {first["device"], second["device"]} == {"cpu"}
    assert {first["device_class"], second["device_class"]} == {"test-cpu"}
    assert (first["run_id"], first["node_id"]) == (7, 1)


def test_the_client_app_writes_the_timing_log(tmp_path: Path) -> None:
    log = tmp_path / "timing.jsonl"
    reply = app(_message(MessageType.QUERY, 3), _context(log))
    assert reply.has_content()
    (line,) = _lines(log)
    assert line["message_type"] == "query" and line["device_class"] == "test-cpu"


def test_the_timing_module_imports_no_torch() -> None:
    # The ClientApp imports it first, so that the first line's imports_s covers torch.
    code = "import sys, fedsync.clients.timing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_benchmark_knows_only_the_stock_and_executor_paths() -> None:
    from benchmarks import deploy_overhead

    assert deploy_overhead.MODES == ("stock", "exec", "exec-poll", "exec-default")
    with pytest.raises(SystemExit) as exit_info:
        deploy_overhead.main(["--modes", "stock,warm"])
    assert exit_info.value.code == 2
