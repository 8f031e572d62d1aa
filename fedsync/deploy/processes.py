"""Start and stop Flower's processes by process id, never by name.

Each process is started in its own session (process group), so stopping it also stops
what it spawned (a SuperNode's ``flwr-clientapp`` children, a SuperLink's
``flwr-serverapp``). Stopping is SIGTERM to the group, a grace period, then SIGKILL.

Flower's log lines carry no time. With ``timestamps=True`` a process's output goes
through a pipe and a relay thread writes each line to the log prefixed with the Unix
time it was read (``1763741234.123 INFO : Receiving: train message ...``): that is how
a SuperNode's receive / ClientApp / send phases of every task are measured
(:func:`read_timestamped_log`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float, process: ManagedProcess) -> None:
    """Block until ``host:port`` accepts TCP connections.

    Raises
    ------
    RuntimeError
        When the process exits first (its log is named) or ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.name} exited with code {process.poll()} before listening on "
                f"{host}:{port}; see {process.log_path}"
            )
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{process.name} did not listen on {host}:{port} within {timeout:.0f}s")


@dataclass
class ManagedProcess:
    """A child process in its own process group, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    relay: threading.Thread | None = None
    """The thread that timestamps the output into the log (``timestamps=True``)."""
    _ended: bool = field(default=False, init=False, repr=False)

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs."""
        return self.popen.poll()

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL it.

        Idempotent: once the group was SIGKILLed and its leader reaped, later calls
        (``kill()`` in a test, ``stop()`` in its ``finally``) signal nothing.
        """
        if self._ended:
            return self.popen.poll()
        if self.popen.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        # Children may outlive a leader that exited on SIGTERM: kill the group anyway.
        self._kill_group()
        return self.popen.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as a test wants it)."""
        if not self._ended:
            self._kill_group()

    def _kill_group(self) -> None:
        _signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        # Once the leader is reaped its pid -- and so the group id -- can be handed to a
        # new process (pids wrap at pid_max, 32768 on small VMs): signalling the group
        # again could kill a stranger, so remember that this one is over.
        self._ended = self.popen.poll() is not None
        self._join_relay()

    def _join_relay(self) -> None:
        # The relay ends at end-of-file, once every process holding the pipe is gone.
        if self.relay is not None:
            self.relay.join(timeout=5)


def start_process(
    name: str,
    command: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
    timestamps: bool = False,
) -> ManagedProcess:
    """Start ``command`` in a new session with stdout and stderr in ``log_path``.

    With ``timestamps`` every line is prefixed with the Unix time it was read (see the
    module docstring); otherwise the process writes to the log file directly.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if not timestamps:
        with log_path.open("ab") as log_file:
            popen = subprocess.Popen(
                list(command),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        return ManagedProcess(name=name, popen=popen, log_path=log_path)
    popen = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    assert popen.stdout is not None
    relay = threading.Thread(
        target=_relay_lines, args=(popen.stdout, log_path), name=f"log-{name}", daemon=True
    )
    relay.start()
    return ManagedProcess(name=name, popen=popen, log_path=log_path, relay=relay)


def _relay_lines(stream: IO[bytes], log_path: Path) -> None:
    with stream, log_path.open("ab") as log_file:
        for line in stream:
            log_file.write(f"{time.time():.3f} ".encode() + line)
            log_file.flush()


def read_timestamped_log(path: Path) -> Iterator[tuple[float, str]]:
    """``(unix time, line)`` for each line of a log written with ``timestamps=True``.

    Lines without a time prefix (written by something else) are skipped.
    """
    with path.open(encoding="utf-8", errors="replace") as file:
        for raw in file:
            stamp, _, text = raw.partition(" ")
            try:
                when = float(stamp)
            except ValueError:
                continue
            yield when, text.rstrip("\n")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
