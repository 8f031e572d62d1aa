"""A real Flower deployment on one machine: a SuperLink and N SuperNodes over gRPC.

This is the deployment path, not the simulation engine: ``flower-superlink`` serves the
Fleet API over gRPC (grpc-rere, Flower 1.39), each ``flower-supernode`` connects to it
like an edge device would, and ``flwr run`` submits the app through the Control API.

Everything lives in one run folder: ``FLWR_HOME`` (so the user's ``~/.flwr`` is never
touched), the SuperLink database, every process's log and the results. Flower's runtime
dependency installation is disabled: otherwise the SuperLink would ``uv sync`` the app's
dependencies for every run (a CUDA torch build, from the network).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from fedsync.deploy.processes import ManagedProcess, free_port, start_process, wait_for_port

CONNECTION = "local-deploy"
"""The name of the SuperLink connection written into the run's ``config.toml``."""

_RUN_ID = re.compile(r"Successfully started run (\d+)")


class DeploymentError(RuntimeError):
    """The deployment could not start, or a run did not finish as it should."""


@dataclass(frozen=True)
class RunOutcome:
    """How a ``flwr run`` ended, read from the SuperLink (not from the CLI's exit code).

    ``flwr run --stream`` exits 0 even when the run failed, so the status comes from
    ``flwr ls --run-id ID --format json``.
    """

    run_id: int
    status: str
    details: str
    output: str

    @property
    def completed(self) -> bool:
        """True when the run finished and its ServerApp returned normally."""
        return self.status == "finished:completed"


def _flwr_bin(name: str) -> str:
    """Find a Flower executable next to this Python first (the project's venv)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"{name} not found: install flwr[simulation]==1.39.*")
    return found


@dataclass
class LocalSuperLink:
    """A ``flower-superlink`` on loopback and the ``flwr`` CLI pointed at it.

    Parameters
    ----------
    workdir : pathlib.Path
        The run folder: ``FLWR_HOME``, database, logs.
    simulation : bool
        Start it with ``--simulation`` (Flower's simulation engine runs the ClientApps
        on Ray) instead of serving SuperNodes over the gRPC Fleet API.
    host : str
        The loopback address everything binds to.
    startup_timeout : float
        Seconds to wait for its ports.
    """

    workdir: Path
    simulation: bool = False
    host: str = "127.0.0.1"
    startup_timeout: float = 60.0
    process: ManagedProcess | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.fleet_port = free_port(self.host)
        self.control_port = free_port(self.host)
        self.http_port = free_port(self.host)

    def env(self) -> dict[str, str]:
        """The environment every Flower process of this run folder runs with."""
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(self.flwr_home),
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            FLWR_DISABLE_UPDATE_CHECK="1",
            PYTHONUNBUFFERED="1",
        )
        return env

    def start(self) -> LocalSuperLink:
        """Start the SuperLink and wait until its ports accept connections."""
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self._write_cli_config()
        command = [
            _flwr_bin("flower-superlink"),
            "--insecure",
            "--control-api-address",
            f"{self.host}:{self.control_port}",
            "--host",
            self.host,
            "--port",
            str(self.http_port),
            "--database",
            str(self.workdir / "superlink.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.simulation:
            command.append("--simulation")
        else:
            command += ["--fleet-api-address", f"{self.host}:{self.fleet_port}"]
        self.process = start_process(
            "superlink", command, log_path=self.logs / "superlink.log", env=self.env()
        )
        try:
            if not self.simulation:
                wait_for_port(self.host, self.fleet_port, self.startup_timeout, self.process)
            wait_for_port(self.host, self.http_port, self.startup_timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the SuperLink (and the ServerApp process it spawned)."""
        if self.process is not None:
            self.process.stop(grace=10.0)

    def run_app(
        self,
        app_dir: Path,
        run_config: Mapping[str, Any] | None = None,
        *,
        federation_config: Mapping[str, Any] | None = None,
        timeout: float = 900.0,
        echo: bool = False,
    ) -> RunOutcome:
        """Submit the app with ``flwr run``, stream it to the end, and read its status.

        Raises
        ------
        DeploymentError
            When the run cannot be submitted or does not end within ``timeout``.
        """
        command = [_flwr_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream"]
        if run_config:
            command += ["--run-config", _config_string(run_config)]
        if federation_config:
            command += ["--federation-config", _config_string(federation_config)]
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"flwr-run-{time.strftime('%H%M%S')}.log"
        output = _stream_command(command, self.env(), log_path, timeout=timeout, echo=echo)
        match = _RUN_ID.search(output)
        if match is None:
            raise DeploymentError(f"flwr run did not start a run:\n{output[-2000:]}")
        run_id = int(match.group(1))
        status, details = self.run_status(run_id)
        return RunOutcome(run_id=run_id, status=status, details=details, output=output)

    def run_status(self, run_id: int) -> tuple[str, str]:
        """``(status, details)`` of a run, as the SuperLink reports it."""
        result = subprocess.run(
            [_flwr_bin("flwr"), "ls", CONNECTION, "--run-id", str(run_id), "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
            check=False,
        )
        try:
            run = json.loads(result.stdout)["runs"][0]
        except (json.JSONDecodeError, KeyError, IndexError) as err:
            raise DeploymentError(
                f"cannot read the status of run {run_id}: {result.stdout} {result.stderr}"
            ) from err
        return str(run["status"]), str(run.get("status-details", ""))

    def _write_cli_config(self) -> None:
        # The flwr CLI reads connections from $FLWR_HOME/config.toml; an explicit
        # address makes it talk to this SuperLink instead of starting its own.
        (self.flwr_home / "config.toml").write_text(
            "[superlink]\n"
            f'default = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "{self.host}:{self.http_port}"\n'
            "insecure = true\n",
            encoding="utf-8",
        )


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on loopback over gRPC, started and stopped by pid.

    Parameters
    ----------
    workdir : pathlib.Path
        The run folder: FLWR_HOME, database, logs.
    node_configs : sequence of mapping
        One node config per SuperNode (``partition-id``, ``num-partitions``,
        ``device``, ...).
    host : str
        The loopback address everything binds to.
    """

    workdir: Path
    node_configs: Sequence[Mapping[str, Any]]
    host: str = "127.0.0.1"
    supernodes: list[ManagedProcess] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.node_configs:
            raise ValueError("a deployment needs at least one SuperNode node config")
        self.link = LocalSuperLink(self.workdir, simulation=False, host=self.host)

    def start(self) -> LocalDeployment:
        """Start the SuperLink, then every SuperNode."""
        self.link.start()
        try:
            for index in range(len(self.node_configs)):
                self.supernodes.append(self.start_supernode(index))
        except BaseException:
            self.stop()
            raise
        return self

    def start_supernode(self, index: int) -> ManagedProcess:
        """Start (or restart) the SuperNode with node config ``node_configs[index]``."""
        return start_process(
            f"supernode-{index}",
            [
                _flwr_bin("flower-supernode"),
                "--insecure",
                "--superlink",
                f"{self.host}:{self.link.fleet_port}",
                "--host",
                self.host,
                "--port",
                str(free_port(self.host)),
                "--node-config",
                _config_string(self.node_configs[index]),
                # Give up on a SuperLink that is gone instead of retrying forever.
                "--max-wait-time",
                "120",
            ],
            log_path=self.link.logs / f"supernode-{index}.log",
            env=self.link.env(),
        )

    def run_app(
        self,
        app_dir: Path,
        run_config: Mapping[str, Any] | None = None,
        *,
        timeout: float = 900.0,
        echo: bool = False,
    ) -> RunOutcome:
        """Run the app on the SuperNodes (see :meth:`LocalSuperLink.run_app`)."""
        return self.link.run_app(app_dir, run_config, timeout=timeout, echo=echo)

    def stop(self) -> None:
        """Stop the SuperNodes first (they would retry a vanished SuperLink), then it."""
        for node in self.supernodes:
            node.stop(grace=5.0)
        self.link.stop()

    def pids(self) -> list[int]:
        """Process ids of everything this deployment started (SuperLink last)."""
        link = [self.link.process.pid] if self.link.process else []
        return [node.pid for node in self.supernodes] + link

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stream_command(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, *, timeout: float, echo: bool
) -> str:
    """Run a command to its end, teeing its output to ``log_path``; return the output."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    with (
        subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            text=True,
            start_new_session=True,
        ) as cli,
        log_path.open("w", encoding="utf-8") as log_file,
    ):
        assert cli.stdout is not None
        for line in cli.stdout:
            lines.append(line)
            log_file.write(line)
            if echo:
                print(line, end="", flush=True)
            if time.monotonic() > deadline:
                cli.kill()
                raise DeploymentError(f"{command[1]} did not finish within {timeout:.0f}s")
        cli.wait(timeout=30)
    return "".join(lines)


def _config_string(config: Mapping[str, Any]) -> str:
    """Format a mapping as Flower's ``"key=value key=value"`` config string."""
    return " ".join(f"{key}={_config_literal(value)}" for key, value in config.items())


def _config_literal(value: Any) -> str:
    """Format a value for Flower's ``key=value`` config strings (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))
