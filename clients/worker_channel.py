"""The local channel between a node's per-message ClientApp and its warm worker.

Flower 1.39 starts a fresh ``flwr-clientapp`` process for every message. With node config
``worker-dir=/path`` that process stays thin (:mod:`fedsync.clients.warm`): it hands the message
and its ``Context`` to a long-lived worker (:mod:`fedsync.clients.worker`) over a Unix socket and
returns the worker's reply. The worker keeps the imported modules, the data partition,
the codec and (on a GPU) the CUDA context between tasks.

Only the node's own ClientApp can reach its worker:

* the folder holding the socket is created ``0700`` and refused when it is reachable by
  another user (group or other permission bits set) or owned by someone else;
* every request starts with a 256-bit token read from ``<worker-dir>/token`` (``0600``,
  created once); the worker compares it in constant time and refuses anything else;
* the worker serves one node id and one run id; a task naming another node is refused,
  a task for another run makes the ClientApp retire that worker and start a fresh one.

Framing: every frame is an 8-byte big-endian length and that many bytes; a request is a
JSON header frame, which the worker answers with ``go`` or a refusal before anything else
moves, then the serialized ``Message`` and the serialized ``Context``; a reply is
a JSON header frame and, when the header says ``ok``, the reply ``Message`` and the
updated ``Context``. Lengths are checked against :data:`MAX_FRAME` before anything is
allocated.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import struct
from pathlib import Path
from typing import Any, Final

__all__ = [
    "MAX_FRAME",
    "SOCKET_NAME",
    "TOKEN_NAME",
    "ChannelError",
    "WorkerGone",
    "group_alive",
    "read_frame",
    "read_header",
    "read_token",
    "secure_dir",
    "write_frame",
    "write_header",
]

SOCKET_NAME: Final = "worker.sock"
TOKEN_NAME: Final = "token"
PID_NAME: Final = "worker.pid"
LOG_NAME: Final = "worker.log"
MAX_FRAME: Final = 1 << 31
"""Largest frame accepted (2 GiB): a model and its context, with room to spare."""
MAX_HEADER: Final = 1 << 16
_LENGTH = struct.Struct(">Q")


class ChannelError(RuntimeError):
    """The worker channel is unsafe or a frame is malformed."""


class WorkerGone(ChannelError):
    """The worker closed the connection before a whole reply arrived (it died)."""


def secure_dir(path: Path) -> Path:
    """Create ``path`` as ``0700`` (if missing) and check nobody else can reach it.

    Raises
    ------
    ChannelError
        When the folder belongs to another user or has group/other permission bits.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise ChannelError(f"worker-dir {path} belongs to uid {info.st_uid}, not to this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise ChannelError(
            f"worker-dir {path} has mode {stat.S_IMODE(info.st_mode):o}; it must be 0700"
        )
    return path


def read_token(folder: Path, *, create: bool) -> bytes:
    """The folder's token (64 hex characters); create it (``0600``) when asked and missing."""
    path = folder / TOKEN_NAME
    if create and not path.exists():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another ClientApp of this node won the race; read its token
        else:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(secrets.token_hex(32))
    token = path.read_bytes().strip()
    if len(token) != 64:
        raise ChannelError(f"{path} does not hold a 64-character token")
    return token


def _read_exact(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise WorkerGone(f"connection closed after {got} of {size} bytes")
        got += count
    return bytes(buffer)


def read_frame(sock: socket.socket, limit: int = MAX_FRAME) -> bytes:
    """One length-prefixed frame; the length is checked before the bytes are read."""
    (size,) = _LENGTH.unpack(_read_exact(sock, _LENGTH.size))
    if size > limit:
        raise ChannelError(f"frame of {size} bytes exceeds the limit of {limit}")
    return _read_exact(sock, size)


def write_frame(sock: socket.socket, payload: bytes) -> None:
    """Send one length-prefixed frame."""
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def read_header(sock: socket.socket) -> dict[str, Any]:
    """A JSON header frame (a mapping, at most :data:`MAX_HEADER` bytes)."""
    raw = read_frame(sock, MAX_HEADER)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ChannelError(f"header is not JSON: {err}") from err
    if not isinstance(header, dict):
        raise ChannelError("header is not a JSON object")
    return header


def write_header(sock: socket.socket, header: dict[str, Any]) -> None:
    """Send a JSON header frame."""
    write_frame(sock, json.dumps(header).encode())


def group_alive() -> bool:
    """Whether the leader of this process group (the SuperNode) still runs."""
    try:
        os.kill(os.getpgrp(), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
