"""A Ray cluster for Flower's simulation engine, started and stopped by process id.

Flower's simulation runs ClientApps as Ray actors. ``flwr-simulation`` calls
``ray.init()`` without an address, and Ray then joins the cluster named by the
``RAY_ADDRESS`` environment variable when one is set, instead of starting a private
one. So a simulation SuperLink started with ``RAY_ADDRESS=<head>:<gcs port>`` in its
environment places its ClientApp actors on every node of that cluster
(:meth:`LocalRayCluster.env`).

:class:`LocalRayCluster` starts Ray nodes on this machine, each with ``ray start
--block`` (the command stays in the foreground, owns its node's daemons and stops them
when it ends), its own ports, CPUs and a custom resource ``node-<name>``. It is what the
tests and a single-machine trial use; on real machines each runs its own ``ray start``
(docs/deployment.md, "Simulation on a Ray cluster"). Stopping is by pid: the tree of every node
command, never ``ray stop``, which would end every Ray process of the user on the
machine, other people's clusters included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fedsync.deploy.local import DeploymentError, _flwr_bin
from fedsync.deploy.processes import ManagedProcess, free_port, start_process, wait_for_port
from fedsync.deploy.proctree import descendants, process_name, terminate_pids

__all__ = ["LocalRayCluster", "RayNodeSpec"]

_NODE_LINE = re.compile(r"^\s*\d+\s+(node_[0-9a-f]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class RayNodeSpec:
    """One Ray node: a name (its custom resource is ``node-<name>``) and its CPUs."""

    name: str
    num_cpus: int = 1
    resources: Mapping[str, float] = field(default_factory=dict)

    def all_resources(self) -> dict[str, float]:
        """The custom resources it advertises: ``node-<name>: 1`` and any extra."""
        return {f"node-{self.name}": 1.0, **self.resources}


@dataclass
class LocalRayCluster:
    """A head node and worker nodes on this machine, each its own ``ray start --block``.

    Parameters
    ----------
    workdir : pathlib.Path
        Logs of every node command.
    nodes : sequence of RayNodeSpec
        The head first, then the workers.
    host : str
        The address every node binds to and advertises (``--node-ip-address``).
    startup_timeout : float
        Seconds to wait for the head's GCS port and for all nodes to register.
    """

    workdir: Path
    nodes: Sequence[RayNodeSpec] = (RayNodeSpec("head"), RayNodeSpec("worker"))
    host: str = "127.0.0.1"
    startup_timeout: float = 120.0
    processes: list[ManagedProcess] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a Ray cluster needs at least a head node")
        if len({spec.name for spec in self.nodes}) != len(self.nodes):
            raise ValueError("Ray node names must be unique")
        self.workdir = self.workdir.resolve()
        self.gcs_port = free_port(self.host)
        # Ray's temp root (sessions, sockets, and the "last cluster started here" file
        # that ray.init() without an address connects to): private, so this cluster
        # never becomes the one other simulations on the machine join, and is short,
        # since Unix socket paths under it are limited to 107 bytes.
        self.ray_tmpdir = Path(tempfile.mkdtemp(prefix="fsray-", dir="/tmp"))
        self._tree: set[int] = set()

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS: what ``ray start --address`` and RAY_ADDRESS name."""
        return f"{self.host}:{self.gcs_port}"

    def env(self) -> dict[str, str]:
        """Environment that makes ``ray.init()`` (Flower's simulation) join this cluster."""
        return {"RAY_ADDRESS": self.address}

    def node_command(self, index: int) -> list[str]:
        """The ``ray start --block`` command of node ``index`` (0 is the head)."""
        spec = self.nodes[index]
        command = [
            _flwr_bin("ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            self.host,
            "--num-cpus",
            str(spec.num_cpus),
            "--num-gpus",
            "0",
            "--resources",
            json.dumps(spec.all_resources()),
            # Fixed, free ports per node: two raylets on one machine (and other users'
            # clusters) must not meet on Ray's default ports.
            "--node-manager-port",
            str(free_port(self.host)),
            "--object-manager-port",
            str(free_port(self.host)),
            "--metrics-export-port",
            str(free_port(self.host)),
            "--dashboard-agent-listen-port",
            str(free_port(self.host)),
            "--dashboard-agent-grpc-port",
            str(free_port(self.host)),
            "--runtime-env-agent-port",
            str(free_port(self.host)),
            "--object-store-memory",
            str(200 * 1024 * 1024),
        ]
        if index == 0:
            command += [
                "--head",
                "--port",
                str(self.gcs_port),
                "--ray-client-server-port",
                str(free_port(self.host)),
                # The dashboard needs ray[default]'s extra packages; flwr[simulation]
                # installs Ray without them.
                "--include-dashboard",
                "false",
            ]
        else:
            command += ["--address", self.address]
        return command

    def start(self) -> LocalRayCluster:
        """Start the head, then each worker; return once every node is registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for index, spec in enumerate(self.nodes):
                process = start_process(
                    f"ray-{spec.name}",
                    self.node_command(index),
                    log_path=self.workdir / f"ray-{spec.name}.log",
                    env=self._node_env(),
                )
                self.processes.append(process)
                if index == 0:
                    wait_for_port(self.host, self.gcs_port, self.startup_timeout, process)
                self._wait_for_nodes(index + 1)
        except BaseException:
            self.stop()
            raise
        return self

    def _node_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env["RAY_TMPDIR"] = str(self.ray_tmpdir)
        return env

    def status(self) -> str:
        """``ray status`` of the cluster (nodes and resources), read from the head's GCS."""
        try:
            result = subprocess.run(
                [_flwr_bin("ray"), "status", "--address", self.address],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=self._node_env(),
            )
        except subprocess.TimeoutExpired:
            return ""
        return result.stdout if result.returncode == 0 else ""

    def alive_nodes(self) -> list[str]:
        """Ids of the active nodes, as ``ray status`` lists them."""
        text = self.status()
        active = text.split("Active:", 1)[1].split("Pending:", 1)[0] if "Active:" in text else ""
        return _NODE_LINE.findall(active)

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise DeploymentError(
                        f"{process.name} exited with {process.poll()}; see {process.log_path}"
                    )
            self._remember_tree()
            if len(self.alive_nodes()) >= count:
                return
            time.sleep(1.0)
        raise DeploymentError(f"only {len(self.alive_nodes())} of {count} Ray nodes registered")

    def _remember_tree(self) -> None:
        for process in self.processes:
            self._tree.update(descendants(process.pid))

    def pids(self) -> dict[int, str]:
        """Every live process of the cluster's node commands, pid -> short name."""
        self._remember_tree()
        return {pid: process_name(pid) for pid in sorted(self._tree) if process_name(pid) != "?"}

    def stop(self, grace: float = 15.0) -> list[int]:
        """Stop every node (workers first) and whatever it spawned; the pids SIGKILLed.

        Each ``ray start --block`` stops its node's daemons on SIGTERM; pids seen in the
        tree before (Ray's daemons can outlive their parent) are ended by pid afterwards.
        """
        self._remember_tree()
        for process in reversed(self.processes):
            process.stop(grace=grace)
        killed = terminate_pids(sorted(self._tree), grace=grace)
        shutil.rmtree(self.ray_tmpdir, ignore_errors=True)
        return killed

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
