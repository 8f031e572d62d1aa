"""The warm worker (fedsync.clients.worker) behind the thin ClientApp (fedsync.clients.warm),
real processes.

Each test talks to a real worker process over its real Unix socket, with real Flower
messages of the real app (dense train tasks of the digits MLP); faults are real too: a
SIGKILL mid-task, a task of another run, a client with another node's token.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.message.message import make_message
from flwr.app.metadata import Metadata

from fedsync import protocol
from fedsync.clients.warm import WorkerClient
from fedsync.clients.worker_channel import PID_NAME, ChannelError, read_token, secure_dir
from fedsync.config import RunConfig, SettingsError
from fedsync.task import model_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE_CONFIG: dict[str, bool | float | int | str] = {
    "partition-id": 0,
    "num-partitions": 4,
    "device": "cpu",
}


def _task(epochs: int, run_id: int = 1, node_id: int = 7) -> tuple[Message, Context]:
    run_config: dict[str, bool | float | int | str] = {
        "dataset": "digits",
        "model": "auto",
        "local-epochs": epochs,
    }
    model = model_for(RunConfig.from_run_config(run_config).training)
    content = RecordDict(
        {
            protocol.ARRAYS: ArrayRecord(model.state_dict()),
            protocol.CONFIG: ConfigRecord({protocol.LOCAL_EPOCHS: epochs}),
        }
    )
    metadata = Metadata(
        run_id=run_id,
        message_id=f"task-{time.monotonic_ns()}",
        src_node_id=1,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id="1",
        created_at=time.time(),
        ttl=600.0,
        message_type="train",
    )
    message = make_message(metadata=metadata, content=content)
    context = Context(run_id, node_id, dict(NODE_CONFIG), RecordDict(), run_config)
    return message, context


def _pid(folder: Path) -> int:
    return int((folder / PID_NAME).read_text())


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _stop_worker(folder: Path) -> None:
    pid_file = folder / PID_NAME
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(_pid(folder), signal.SIGKILL)


@pytest.fixture
def worker_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "worker"
    yield folder
    _stop_worker(folder)


def test_warm_worker_serves_tasks_and_recovers_from_a_crash_mid_task(worker_dir: Path) -> None:
    client = WorkerClient(worker_dir, node_id=7)
    message, context = _task(epochs=1)
    reply, phases = client.run(message, context)
    assert reply.content.array_records[protocol.ARRAYS]
    first_pid = _pid(worker_dir)
    assert phases["worker_pid"] == first_pid and phases["worker_tasks"] == 1

    # Warm: the same process serves the next task, imports and data already loaded.
    reply, phases = client.run(*_task(epochs=1))
    assert phases["worker_pid"] == first_pid and phases["worker_tasks"] == 2
    assert phases["data_s"] < 0.5

    # A SIGKILL while the worker trains: the ClientApp starts a fresh one and reruns the task.
    # (1,000 epochs of a small partition: seconds on an idle machine, so the kill at
    # 0.5 s lands while it trains; 300 finished in under a second here.)
    message, context = _task(epochs=1000)
    killer = threading.Timer(0.5, os.kill, (first_pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    reply, phases = client.run(message, context)
    killer.join()
    assert time.monotonic() - started > 0.5
    steps = reply.content.metric_records[protocol.METRICS][protocol.NUM_STEPS]
    assert isinstance(steps, int) and steps > 0
    assert phases["worker_pid"] != first_pid and phases["worker_tasks"] == 1
    assert "worker pid" in (worker_dir / "worker.log").read_text()


def test_a_task_of_another_run_retires_the_worker(worker_dir: Path) -> None:
    client = WorkerClient(worker_dir, node_id=7)
    _, phases = client.run(*_task(epochs=1, run_id=1))
    old = phases["worker_pid"]
    _, phases = client.run(*_task(epochs=1, run_id=2))
    assert phases["worker_pid"] != old and phases["worker_tasks"] == 1
    log = (worker_dir / "worker.log").read_text()
    assert "task for run 2; this worker holds run 1" in log
    for _ in range(50):  # the old worker was asked to exit (a zombie until reaped)
        if not _running(old):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the retired worker still runs")


def test_another_nodes_clientapp_is_refused_and_the_worker_goes_on(
    worker_dir: Path, tmp_path: Path
) -> None:
    own = WorkerClient(worker_dir, node_id=7)
    own.run(*_task(epochs=1))
    pid = _pid(worker_dir)

    # Node 8's ClientApp, with its own folder and token, aimed at node 7's socket.
    intruder = WorkerClient(tmp_path / "other-node", node_id=8)
    intruder.socket_path = worker_dir / "worker.sock"
    with pytest.raises(ChannelError, match="wrong token"):
        intruder.run(*_task(epochs=1, node_id=8))
    # The right token but another node id: refused as well.
    intruder.token = read_token(worker_dir, create=False).decode()
    with pytest.raises(ChannelError, match="this worker serves node 7"):
        intruder.run(*_task(epochs=1, node_id=8))
    assert "refused a request" in (worker_dir / "worker.log").read_text()

    # Nothing happened to the worker: the node's next task runs on it.
    _, phases = own.run(*_task(epochs=1))
    assert phases["worker_pid"] == pid and phases["worker_tasks"] == 2


def test_an_open_worker_dir_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(ChannelError, match="must be 0700"):
        secure_dir(folder)


def test_node_device_wins_over_the_run_config() -> None:
    from fedsync.clients.runtime import ClientRuntime

    _message, context = _task(epochs=1)
    context.run_config["device"] = "cuda:0"  # what the run asks; the node says cpu
    assert ClientRuntime.from_context(context).device == torch.device("cpu")
    context.node_config["device"] = "tpu-42"
    with pytest.raises(SettingsError, match="not a torch device"):
        ClientRuntime.from_context(context)
