"""``fedsync-node``: one command for a warm edge node (a SuperNode and its executor).

Everything after ``--`` goes to ``flower-supernode`` unchanged (the SuperLink address,
certificates, node key, node config); ``fedsync-node`` adds ``--isolation process`` and a
loopback Runtime API address, and starts the warm executor (:mod:`fedsync.clientapp.node_exec`,
supervised: started again whenever it dies) on that address::

    fedsync-node -- --superlink LINK:9092 --root-certificates ca.crt \\
        --auth-supernode-private-key node.key \\
        --node-config 'partition-id=0 num-partitions=4 device="cuda:0"'

Both run as children of this process, in its process group: the executor leaves by
itself when the group's leader is gone, and ``fedsync-node`` stops both (SIGTERM, a
grace period, then SIGKILL, then the rest of its group) when SIGINT/SIGTERM arrives or
the SuperNode exits. Its exit code is the SuperNode's (0 after a requested stop).
By default the SuperNode runs through :mod:`fedsync.deploy.fast_poll`, so it asks the
SuperLink for work every :data:`DEFAULT_SUPERNODE_POLL` seconds (``--supernode-poll S``
sets another interval) instead of Flower's hard-coded 3 s, which would otherwise be
nearly all of a warm task's overhead. That launcher patches a Flower 1.39 internal
(:mod:`fedsync.compat.flower139`, section 2): on another Flower, ``fedsync-node`` says so
once and starts the stock SuperNode (3 s a task more), and an explicit
``--supernode-poll`` is refused there. ``--supernode-poll 0`` keeps Flower's poll.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from fedsync.deploy.fast_poll import POLL_ENV
from fedsync.deploy.processes import free_port

__all__ = ["DEFAULT_SUPERNODE_POLL", "main", "node_commands", "supernode_poll"]

DEFAULT_SUPERNODE_POLL: Final = 0.1
"""Seconds between an idle SuperNode's asks for work under ``fedsync-node`` (Flower's
own: 3 s). ``n`` idle nodes cost the SuperLink ``n / 0.1`` small requests a second
(``benchmarks/results/deploy_overhead_default.json``, ``superlink_cpu_s``)."""

OWN_FLAGS = ("--isolation", "--host", "--port")
"""``flower-supernode`` flags ``fedsync-node`` sets itself."""


class NodeArgumentError(ValueError):
    """The ``flower-supernode`` arguments conflict with what ``fedsync-node`` sets."""


def node_commands(
    supernode_args: Sequence[str],
    *,
    runtime_port: int,
    executor_poll: float = 0.05,
    supernode_bin: str = "flower-supernode",
    supernode_poll: float = 0.0,
) -> tuple[list[str], list[str]]:
    """The SuperNode's and the supervised executor's command lines.

    With ``supernode_poll`` > 0 the SuperNode runs through :mod:`fedsync.deploy.fast_poll`
    (the caller sets its environment variable).

    Raises
    ------
    NodeArgumentError
        If ``supernode_args`` sets ``--isolation``, ``--host`` or ``--port`` (named), or
        has no ``--superlink``.
    """
    for arg in supernode_args:
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise NodeArgumentError(
                f"{flag} is set by fedsync-node (process isolation, a loopback Runtime API); "
                "leave it out"
            )
    if not any(a.split("=", 1)[0] == "--superlink" for a in supernode_args):
        raise NodeArgumentError("flower-supernode needs --superlink HOST:PORT after --")
    if not 0 < runtime_port < 65536:
        raise NodeArgumentError(f"--runtime-port must be in 1..65535, got {runtime_port}")
    launcher = (
        [sys.executable, "-m", "fedsync.deploy.fast_poll"]
        if supernode_poll > 0
        else [supernode_bin]
    )
    supernode = [
        *launcher,
        *supernode_args,
        "--isolation",
        "process",
        "--host",
        "127.0.0.1",
        "--port",
        str(runtime_port),
    ]
    executor = [
        sys.executable,
        "-m",
        "fedsync.clientapp.node_exec",
        "--runtime-api-address",
        f"127.0.0.1:{runtime_port}",
        "--poll",
        f"{executor_poll:g}",
        "--supervise",
    ]
    return supernode, executor


def supernode_poll(requested: float | None) -> float:
    """The SuperNode poll to run with: ``requested``, or by default
    :data:`DEFAULT_SUPERNODE_POLL` where the installed Flower takes it (1.39), else 0
    (Flower's own 3 s, said once on stderr with what it costs)."""
    if requested is not None:
        return requested
    from fedsync.compat import flower139

    problem = flower139.version_problem("the short SuperNode poll")
    if problem:
        print(
            f"[fedsync-node] {problem}: the SuperNode keeps Flower's 3 s poll, about 3 s "
            "more per task (install flwr 1.39 for the short one)",
            file=sys.stderr,
            flush=True,
        )
        return 0.0
    return DEFAULT_SUPERNODE_POLL


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fedsync-node``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, supernode_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if ("--" in argv) else (argv, [])
    )
    parser = argparse.ArgumentParser(
        prog="fedsync-node",
        description="Start flower-supernode and fedsync's warm executor together; "
        "arguments after -- go to flower-supernode.",
    )
    parser.add_argument(
        "--runtime-port",
        type=int,
        default=0,
        help="loopback port of the SuperNode's Runtime API (0: a free one)",
    )
    parser.add_argument(
        "--executor-poll", type=float, default=0.05, help="seconds between an idle executor's asks"
    )
    parser.add_argument(
        "--supernode-poll",
        type=float,
        default=None,
        help=f"seconds between the SuperNode's asks for work (default {DEFAULT_SUPERNODE_POLL:g}; "
        "0: Flower's 3 s; other than 0 needs Flower 1.39)",
    )
    parser.add_argument(
        "--grace", type=float, default=10.0, help="seconds to wait after SIGTERM before SIGKILL"
    )
    args = parser.parse_args(own)
    if args.supernode_poll is not None and not args.supernode_poll >= 0.0:  # NaN too
        parser.error(f"--supernode-poll must be >= 0 seconds, got {args.supernode_poll}")
    args.supernode_poll = supernode_poll(args.supernode_poll)
    supernode_bin = shutil.which("flower-supernode") or str(
        Path(sys.executable).with_name("flower-supernode")
    )
    try:
        supernode_cmd, executor_cmd = node_commands(
            supernode_args,
            runtime_port=args.runtime_port or free_port(),
            executor_poll=args.executor_poll,
            supernode_bin=supernode_bin,
            supernode_poll=args.supernode_poll,
        )
    except NodeArgumentError as err:
        parser.error(str(err))
    # Lead a process group of our own: the executor watches its leader (this process).
    with contextlib.suppress(PermissionError):  # a session leader already leads its group
        os.setpgid(0, 0)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    env = dict(os.environ)
    if args.supernode_poll > 0:
        env[POLL_ENV] = f"{args.supernode_poll:g}"
    supernode = subprocess.Popen(supernode_cmd, env=env)
    executor = subprocess.Popen(executor_cmd)
    print(
        f"[fedsync-node] supernode pid {supernode.pid}, warm executor pid {executor.pid}",
        flush=True,
    )
    try:
        while not stopping and supernode.poll() is None:
            time.sleep(0.2)
    finally:
        _stop(executor, args.grace)
        _stop(supernode, args.grace)
        if os.getpgrp() == os.getpid():
            # The supervisor's executor child, if it outlived its parent; the handler
            # above keeps this process alive through its own group's signal.
            os.killpg(os.getpgrp(), signal.SIGTERM)
    code = supernode.returncode
    return 0 if stopping else int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
