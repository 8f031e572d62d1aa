"""A loopback deployment whose SuperNodes run their ClientApps warm.

:class:`WarmLocalDeployment` is :class:`~fedsync.deploy.local.LocalDeployment` with each
SuperNode started in ``--isolation process`` and, beside it, a supervised warm executor
(``python -m clients.node_exec --supervise``) that runs every ClientApp task of that node
in one long-lived process. Both are in the node's process group (stopped together, by
pid); the executor's log is ``logs/executor-<i>.log``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from fedsync.deploy.auth import NodeKey
from fedsync.deploy.fast_poll import POLL_ENV
from fedsync.deploy.local import LocalDeployment
from fedsync.deploy.processes import ManagedProcess, start_process

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WarmLocalDeployment(LocalDeployment):
    """SuperNodes with warm executors (see the module docs).

    Parameters
    ----------
    executor_poll : float
        Seconds between an idle executor's requests to its SuperNode (loopback only).
    supernode_poll : float
        Above 0: start the SuperNodes through :mod:`fedsync.deploy.fast_poll`, so they
        ask the SuperLink for work this often instead of Flower's fixed 3 s.
    """

    executor_poll: float = 0.05
    supernode_poll: float = 0.0
    executors: list[ManagedProcess] = field(default_factory=list, init=False)

    def supernode_command(self, index: int, *, key: NodeKey | None = None) -> list[str]:
        """The stock command with ``--isolation process`` (and the poll launcher)."""
        command = [*super().supernode_command(index, key=key), "--isolation", "process"]
        if self.supernode_poll > 0:
            at = next(i for i, part in enumerate(command) if part.endswith("flower-supernode"))
            command[at : at + 1] = [sys.executable, "-m", "fedsync.deploy.fast_poll"]
        return command

    def start_supernode(
        self, index: int, *, key: NodeKey | None = None, name: str | None = None
    ) -> ManagedProcess:
        """Start the SuperNode, then its supervised executor on the node's Runtime API."""
        name = name or f"supernode-{index}"
        command = self.supernode_command(index, key=key)
        node_env = self.link.env()
        if self.supernode_poll > 0:
            node_env[POLL_ENV] = f"{self.supernode_poll:g}"
            node_env["PYTHONPATH"] = str(ROOT)
        node = start_process(
            name, command, log_path=self.link.logs / f"{name}.log", env=node_env, timestamps=True
        )
        runtime = f"{command[command.index('--host') + 1]}:{command[command.index('--port') + 1]}"
        executor_command = [
            sys.executable,
            "-m",
            "clients.node_exec",
            "--runtime-api-address",
            runtime,
            "--poll",
            f"{self.executor_poll:g}",
            "--supervise",
        ]
        if self.network is not None:
            executor_command = self.network.links[index].wrap(executor_command)
        env = self.link.env()
        env["PYTHONPATH"] = str(ROOT)
        self.executors.append(
            start_process(
                f"executor-{index}",
                executor_command,
                log_path=self.link.logs / f"executor-{index}.log",
                env=env,
            )
        )
        return node

    def stop(self) -> None:
        """Stop the executors, then the SuperNodes and the SuperLink."""
        for executor in self.executors:
            executor.stop(grace=5.0)
        super().stop()

    def pids(self) -> list[int]:
        """Process ids of everything this deployment started (SuperLink last)."""
        return [e.pid for e in self.executors] + super().pids()
