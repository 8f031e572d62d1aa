"""A loopback deployment whose SuperNodes run their ClientApps warm.

:class:`WarmLocalDeployment` is :class:`~fedsync.deploy.local.LocalDeployment` with each
node started the way a user starts a warm edge node: ``fedsync-node``
(:mod:`fedsync.deploy.node`), which runs ``flower-supernode`` in ``--isolation process``
and, beside it, the supervised warm executor that runs every ClientApp task of that node
in one long-lived process. All of a node's processes share the node's process group
(stopped together, by pid) and its log, ``logs/supernode-<i>.log``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from fedsync.deploy.auth import NodeKey
from fedsync.deploy.local import LocalDeployment
from fedsync.deploy.processes import ManagedProcess, start_process

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WarmLocalDeployment(LocalDeployment):
    """SuperNodes with warm executors, one ``fedsync-node`` each (see the module docs).

    Parameters
    ----------
    executor_poll : float
        Seconds between an idle executor's requests to its SuperNode (loopback only).
    supernode_poll : float or None
        Seconds between the SuperNodes' asks for work (``fedsync-node
        --supernode-poll``); 0: Flower's fixed 3 s; ``None``: ``fedsync-node``'s default
        (:data:`fedsync.deploy.node.DEFAULT_SUPERNODE_POLL` on Flower 1.39).
    """

    executor_poll: float = 0.05
    supernode_poll: float | None = None

    def supernode_command(self, index: int, *, key: NodeKey | None = None) -> list[str]:
        """The stock SuperNode command, run through ``fedsync-node``."""
        command = super().supernode_command(index, key=key)
        at = next(i for i, part in enumerate(command) if part.endswith("flower-supernode"))
        wrapper, args = command[:at], command[at + 1 :]  # a namespace's wrapper, if any
        host_at, port_at = args.index("--host"), args.index("--port")
        port = args[port_at + 1]
        args = [
            a for i, a in enumerate(args) if i not in (host_at, host_at + 1, port_at, port_at + 1)
        ]
        return [
            *wrapper,
            sys.executable,
            "-m",
            "fedsync.deploy.node",
            "--runtime-port",
            port,
            "--executor-poll",
            f"{self.executor_poll:g}",
            *(
                []
                if self.supernode_poll is None
                else ["--supernode-poll", f"{self.supernode_poll:g}"]
            ),
            "--grace",
            "5",
            "--",
            *args,
        ]

    def start_supernode(
        self, index: int, *, key: NodeKey | None = None, name: str | None = None
    ) -> ManagedProcess:
        """Start the node (SuperNode and executor) with this checkout importable."""
        name = name or f"supernode-{index}"
        env = self.link.env()
        # This checkout first; what the caller's PYTHONPATH holds (packages installed
        # with ``pip --target``, say) stays importable after it.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return start_process(
            name,
            self.supernode_command(index, key=key),
            log_path=self.link.logs / f"{name}.log",
            env=env,
            timestamps=True,
        )
