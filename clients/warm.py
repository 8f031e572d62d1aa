"""The ClientApp Flower starts per message: thin, and warm when the node has a worker.

Flower 1.39 runs every message in a fresh ``flwr-clientapp`` process (there is no
supported way to keep one alive across messages). This module is what that process
loads; it imports no torch.

* Node config ``worker-dir=/path`` (the warm path): the message and its ``Context`` go
  to the node's warm worker (:mod:`fedsync.clients.worker`) over a Unix socket in that folder
  (:mod:`fedsync.clients.worker_channel`), and the worker's reply and updated ``context.state``
  come back. The first task starts the worker; later tasks find it warm. A worker that
  died (even mid-task) is started again and the task runs once more; a worker that holds
  another run is retired and replaced. Nothing is lost: ``context.state`` only changes
  when a reply arrives, and node config ``state-dir`` keeps the error-feedback residual
  on disk as before.
* Without ``worker-dir`` (the stock path) the full ClientApp (:mod:`fedsync.clients.app`) runs
  in this process, as before.

Node config ``timing-log=/path.jsonl`` appends one line per message with where this
process's time went (process start, imports, data, training, the rest of the handler),
for :mod:`benchmarks.deploy_overhead`; ``device-class`` (free text, e.g.
``jetson-orin``) is written into those lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Final

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common import serde
from flwr.common.logger import log
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage

import fedsync
from fedsync.clients.worker_channel import (
    LOG_NAME,
    SOCKET_NAME,
    ChannelError,
    WorkerGone,
    read_frame,
    read_header,
    read_token,
    secure_dir,
    write_frame,
    write_header,
)

_LOADED_AT = time.time()
APP_ROOT: Final = Path(fedsync.__file__).resolve().parents[1]
"""The folder holding the ``fedsync`` package this ClientApp runs (a checkout or
``site-packages``): first on the warm worker's ``PYTHONPATH``, so it runs the same code."""
WORKER_DIR: Final = "worker-dir"
"""Node config key: the folder of this node's warm worker (absent: the stock path)."""
TIMING_LOG: Final = "timing-log"
"""Node config key: a JSONL file that gets one line of phase times per message."""
DEVICE_CLASS: Final = "device-class"
"""Node config key: what kind of device this node is (free text, reported only). The
same key as :data:`fedsync.protocol.DEVICE_CLASS`, spelled here because this module
must not import torch (a test checks they agree)."""
WORKER_START_TIMEOUT: Final = 180.0

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train: on the node's warm worker, or in this process (see the module docs)."""
    return _dispatch(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate: on the node's warm worker, or in this process."""
    return _dispatch(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Answer a query: on the node's warm worker, or in this process."""
    return _dispatch(msg, context)


def _dispatch(msg: Message, context: Context) -> Message:
    handler_start = time.time()
    folder = context.node_config.get(WORKER_DIR)
    if folder:
        reply, phases = WorkerClient(Path(str(folder)), context.node_id).run(msg, context)
    else:
        reply, phases = _run_here(msg, context)
    _log_timing(msg, context, reply, phases, handler_start, "warm" if folder else "stock")
    return reply


def _run_here(msg: Message, context: Context) -> tuple[Message, dict[str, Any]]:
    """The stock path: import the full ClientApp and run it in this process."""
    started = time.perf_counter()
    from fedsync.clients.app import app as full_app
    from fedsync.clients.runtime import ClientRuntime

    imports_s = time.perf_counter() - started
    data_s = 0.0
    if msg.metadata.message_type != "query":
        started = time.perf_counter()
        ClientRuntime.from_context(context).data()  # cached: the handler's call is free
        data_s = time.perf_counter() - started
    started = time.perf_counter()
    reply = full_app(msg, context)
    return reply, {
        "imports_s": imports_s,
        "data_s": data_s,
        "handler_s": time.perf_counter() - started,
    }


class WorkerClient:
    """This node's end of the worker channel (see :mod:`fedsync.clients.worker_channel`).

    Parameters
    ----------
    folder : pathlib.Path
        The node's ``worker-dir``; created ``0700``.
    node_id : int
        The Flower node id of the SuperNode this ClientApp serves.
    """

    def __init__(self, folder: Path, node_id: int) -> None:
        self.folder = secure_dir(folder)
        self.token = read_token(self.folder, create=True).decode()
        self.node_id = int(node_id)
        self.socket_path = self.folder / SOCKET_NAME

    def run(self, msg: Message, context: Context) -> tuple[Message, dict[str, Any]]:
        """Run ``msg`` on the worker; update ``context.state`` from its reply."""
        message_bytes = serde.message_to_proto(msg).SerializeToString()
        context_bytes = serde.context_to_proto(context).SerializeToString()
        spawn_s = 0.0
        for attempt in range(3):
            started = time.perf_counter()
            sock = self._connect_or_start(context.run_id)
            spawn_s += time.perf_counter() - started
            try:
                with sock:
                    header, frames = self._exchange(
                        sock, context.run_id, message_bytes, context_bytes
                    )
            except (WorkerGone, ConnectionError) as err:
                if attempt == 2:
                    raise
                log(
                    WARNING,
                    "[fedsync] node %d: its worker died mid-task (%s); starting a fresh "
                    "worker and running the task again",
                    self.node_id,
                    err,
                )
                continue
            status = header.get("status")
            if status == "wrong-run":
                log(
                    INFO,
                    "[fedsync] node %d: worker refused the task (%s); retiring it and "
                    "starting a worker for run %d",
                    self.node_id,
                    header.get("reason"),
                    context.run_id,
                )
                self.shutdown(f"replaced by a worker for run {context.run_id}")
                continue
            if status == "error":
                raise RuntimeError(f"worker: {header.get('reason')}")
            if status != "ok":
                raise ChannelError(f"worker refused the task: {header.get('reason')}")
            reply_proto, context_proto = ProtoMessage(), ProtoContext()
            reply_proto.ParseFromString(frames[0])
            context_proto.ParseFromString(frames[1])
            context.state = serde.context_from_proto(context_proto).state
            worker_reply = serde.message_from_proto(reply_proto)
            reply = Message(content=worker_reply.content, reply_to=msg)
            return reply, {
                "spawn_s": spawn_s,
                "data_s": float(header.get("data_s", 0.0)),
                "handler_s": float(header.get("handler_s", 0.0)),
                "worker_pid": header.get("pid"),
                "worker_tasks": header.get("tasks"),
            }
        raise ChannelError("the worker could not run the task")

    def shutdown(self, reason: str) -> None:
        """Ask the running worker (if any) to exit."""
        with contextlib.suppress(OSError, ChannelError), self._connect() as sock:
            write_header(
                sock,
                {
                    "kind": "shutdown",
                    "token": self.token,
                    "node_id": self.node_id,
                    "reason": reason,
                },
            )
            read_header(sock)

    def _exchange(
        self, sock: socket.socket, run_id: int, message_bytes: bytes, context_bytes: bytes
    ) -> tuple[dict[str, Any], list[bytes]]:
        write_header(
            sock, {"kind": "task", "token": self.token, "node_id": self.node_id, "run_id": run_id}
        )
        # The worker checks the header first: a refusal comes before any task bytes move.
        answer = read_header(sock)
        if answer.get("status") != "go":
            return answer, []
        write_frame(sock, message_bytes)
        write_frame(sock, context_bytes)
        header = read_header(sock)
        if header.get("status") != "ok":
            return header, []
        return header, [read_frame(sock), read_frame(sock)]

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        return sock

    def _connect_or_start(self, run_id: int) -> socket.socket:
        with contextlib.suppress(OSError):
            return self._connect()
        # One ClientApp at a time starts the worker.
        with (self.folder / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                return self._connect()
            return self._start(run_id)

    def _start(self, run_id: int) -> socket.socket:
        log(INFO, "[fedsync] node %d: starting its warm worker for run %d", self.node_id, run_id)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(APP_ROOT), *filter(None, [env.get("PYTHONPATH", "")])]
        )
        with (self.folder / LOG_NAME).open("ab") as log_file:
            # Same process group as the SuperNode: stopping the node stops its worker.
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fedsync.clients.worker",
                    "--dir",
                    str(self.folder),
                    "--node-id",
                    str(self.node_id),
                    "--run-id",
                    str(run_id),
                ],
                cwd=APP_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ChannelError(
                    f"the worker exited with code {process.returncode} while starting; "
                    f"see {self.folder / LOG_NAME}"
                )
            with contextlib.suppress(OSError):
                return self._connect()
            time.sleep(0.02)
        process.kill()
        raise ChannelError(f"the worker did not listen within {WORKER_START_TIMEOUT:.0f}s")


def _process_start_time() -> float:
    """Unix time this process started (Linux ``/proc``; 0.0 elsewhere)."""
    try:
        stat_fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(stat_fields[19])  # field 22 (starttime), after pid and comm
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _log_timing(
    msg: Message,
    context: Context,
    reply: Message,
    phases: dict[str, Any],
    handler_start: float,
    mode: str,
) -> None:
    path = context.node_config.get(TIMING_LOG)
    if not path:
        return
    compute_s = 0.0
    if reply.has_content():
        for record in reply.content.metric_records.values():
            value = record.get("compute-seconds")
            if isinstance(value, int | float):
                compute_s = float(value)
    line = {
        "mode": mode,
        "pid": os.getpid(),
        "run_id": context.run_id,
        "node_id": context.node_id,
        "message_type": msg.metadata.message_type,
        "device": str(context.node_config.get("device", "")),
        "device_class": str(context.node_config.get(DEVICE_CLASS, "")),
        "process_start": _process_start_time(),
        "module_loaded": _LOADED_AT,
        "handler_start": handler_start,
        "handler_end": time.time(),
        "compute_s": compute_s,
        **phases,
    }
    with Path(str(path)).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
