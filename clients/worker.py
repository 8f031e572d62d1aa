"""A node's warm worker: runs the fedsync ClientApp for many messages in one process.

Started by the node's thin ClientApp (:mod:`fedsync.clients.warm`) on first use, with the app's
folder on ``PYTHONPATH`` (the same code version the SuperNode installed from the FAB)::

    python -m fedsync.clients.worker --dir WORKER_DIR --node-id N --run-id R

It imports torch and the app once, then serves tasks one at a time on
``<dir>/worker.sock``; the data partition is cached by the loader, so it too is loaded
once. Each request is checked (token, node id, run id: :mod:`fedsync.clients.worker_channel`)
before its bytes are decoded; a refused request gets a header that says why and a log
line. The worker leaves when its SuperNode's process group is gone, when it has been idle
for ``--idle-timeout`` seconds, or when a ClientApp asks it to (``shutdown``).
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fedsync.clients.worker_channel import (
    PID_NAME,
    SOCKET_NAME,
    ChannelError,
    group_alive,
    read_frame,
    read_header,
    read_token,
    secure_dir,
    write_frame,
    write_header,
)

_LOG = logging.getLogger("fedsync.worker")
_TICK = 2.0


class Worker:
    """Serve one node's tasks of one run from a warm process (see the module docs)."""

    def __init__(self, folder: Path, node_id: int, run_id: int, idle_timeout: float) -> None:
        self.folder = secure_dir(folder)
        self.token = read_token(self.folder, create=False)
        self.node_id = node_id
        self.run_id = run_id
        self.idle_timeout = idle_timeout
        self.tasks = 0
        started = time.perf_counter()
        # The expensive imports, once per worker.
        from flwr.common import serde
        from flwr.proto.message_pb2 import Context as ProtoContext
        from flwr.proto.message_pb2 import Message as ProtoMessage

        from fedsync.clients.app import app

        self._serde = serde
        self._proto_message = ProtoMessage
        self._proto_context = ProtoContext
        self._app = app
        self.import_s = time.perf_counter() - started

    def serve(self) -> None:
        """Listen on the folder's socket until told to stop, idle, or orphaned."""
        path = self.folder / SOCKET_NAME
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            server.bind(str(path))
        finally:
            os.umask(old_umask)
        server.listen(4)
        server.settimeout(_TICK)
        (self.folder / PID_NAME).write_text(f"{os.getpid()}\n")
        _LOG.info(
            "worker pid %d serves node %d run %d on %s (imports %.2fs)",
            os.getpid(),
            self.node_id,
            self.run_id,
            path,
            self.import_s,
        )
        idle_since = time.monotonic()
        try:
            while True:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    if not group_alive():
                        _LOG.info("the SuperNode's process group is gone; worker exits")
                        return
                    if time.monotonic() - idle_since > self.idle_timeout:
                        _LOG.info("idle for %.0fs; worker exits", self.idle_timeout)
                        return
                    continue
                with conn:
                    keep_going = self._handle(conn)
                idle_since = time.monotonic()
                if not keep_going:
                    return
        finally:
            server.close()
            path.unlink(missing_ok=True)

    def _handle(self, conn: socket.socket) -> bool:
        """Serve one connection; ``False`` when the worker should exit."""
        conn.settimeout(None)
        try:
            header = read_header(conn)
            refusal = self._check(header)
            if refusal is not None:
                status, reason = refusal
                _LOG.warning("refused a request: %s", reason)
                write_header(conn, {"status": status, "reason": reason, "run_id": self.run_id})
                return True
            if header.get("kind") == "shutdown":
                _LOG.info("asked to exit: %s", header.get("reason", ""))
                write_header(conn, {"status": "ok"})
                return False
            if header.get("kind") == "ping":
                write_header(conn, {"status": "ok", "pid": os.getpid(), "tasks": self.tasks})
                return True
            write_header(conn, {"status": "go"})  # checked: now the task's bytes may come
            message_bytes = read_frame(conn)
            context_bytes = read_frame(conn)
        except (ChannelError, OSError) as err:
            _LOG.warning("dropped a malformed request: %s", err)
            return True
        self._run_task(conn, message_bytes, context_bytes)
        return True

    def _check(self, header: dict[str, Any]) -> tuple[str, str] | None:
        token = str(header.get("token", "")).encode()
        if not hmac.compare_digest(token, self.token):
            return "refused", "wrong token: this worker serves another node's ClientApp"
        if header.get("node_id") != self.node_id:
            return (
                "refused",
                f"task for node {header.get('node_id')}; this worker serves node {self.node_id}",
            )
        if header.get("kind") == "task" and header.get("run_id") != self.run_id:
            return (
                "wrong-run",
                f"task for run {header.get('run_id')}; this worker holds run {self.run_id}",
            )
        return None

    def _run_task(self, conn: socket.socket, message_bytes: bytes, context_bytes: bytes) -> None:
        serde = self._serde
        started = time.perf_counter()
        try:
            proto_message = self._proto_message()
            proto_message.ParseFromString(message_bytes)
            proto_context = self._proto_context()
            proto_context.ParseFromString(context_bytes)
            message = serde.message_from_proto(proto_message)
            context = serde.context_from_proto(proto_context)
            data_s = _load_data(context)
            handler_started = time.perf_counter()
            reply = self._app(message, context)
            handler_s = time.perf_counter() - handler_started
            reply_bytes = serde.message_to_proto(reply).SerializeToString()
            state_bytes = serde.context_to_proto(context).SerializeToString()
        except Exception as err:
            _LOG.error("task failed: %s", err)
            write_header(
                conn,
                {
                    "status": "error",
                    "reason": f"{type(err).__name__}: {err}",
                    "trace": traceback.format_exc()[-4000:],
                },
            )
            return
        self.tasks += 1
        write_header(
            conn,
            {
                "status": "ok",
                "pid": os.getpid(),
                "tasks": self.tasks,
                "data_s": data_s,
                "handler_s": handler_s,
                "worker_s": time.perf_counter() - started,
            },
        )
        write_frame(conn, reply_bytes)
        write_frame(conn, state_bytes)


def _load_data(context: Any) -> float:
    """Load (or find cached) the node's partition; the seconds it took."""
    from fedsync.clients.runtime import ClientRuntime

    started = time.perf_counter()
    ClientRuntime.from_context(context).data()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fedsync.clients.worker``."""
    parser = argparse.ArgumentParser(prog="python -m fedsync.clients.worker", description=__doc__)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--node-id", required=True, type=int)
    parser.add_argument("--run-id", required=True, type=int)
    parser.add_argument("--idle-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s fedsync-worker: %(message)s",
        stream=sys.stderr,
    )
    try:
        worker = Worker(args.dir, args.node_id, args.run_id, args.idle_timeout)
    except ChannelError as err:
        _LOG.error("cannot start: %s", err)
        return 2
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
