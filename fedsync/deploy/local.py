"""A real Flower deployment on one machine: a SuperLink and N SuperNodes over gRPC.

This is the deployment path, not the simulation engine: ``flower-superlink`` serves the
Fleet API over gRPC (grpc-rere, Flower 1.39), each ``flower-supernode`` connects to it
like an edge device would, and ``flwr run`` submits the app through the Control API.

Everything lives in one run folder: ``FLWR_HOME`` (so the user's ``~/.flwr`` is never
touched), the SuperLink database, every process's log and the results. Flower's runtime
dependency installation is disabled: otherwise the SuperLink would ``uv sync`` the app's
dependencies for every run (a CUDA torch build, from the network).

Secure by default: the SuperLink serves TLS with a CA and server certificate generated
into ``<run folder>/certs`` (:mod:`fedsync.deploy.tls`), SuperNodes verify it with
``--root-certificates``, and with :class:`LocalDeployment` every SuperNode authenticates
with its own OpenSSH ECDSA key (``<run folder>/keys``), registered on the SuperLink
before the node starts (:mod:`fedsync.deploy.auth`). ``insecure=True`` turns all of that
off, with a warning. A :class:`~fedsync.deploy.netns.ShapedNetwork` puts each SuperNode
in its own network namespace behind a rate-limited link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from fedsync.deploy.auth import AlreadyRegistered, NodeKey, generate_node_key, register_node
from fedsync.deploy.netns import ShapedNetwork
from fedsync.deploy.processes import ManagedProcess, free_port, start_process, wait_for_port
from fedsync.deploy.tls import TlsFiles, generate_certificates

CONNECTION = "local-deploy"
"""The name of the SuperLink connection written into the run's ``config.toml``."""

_RUN_ID = re.compile(r"Successfully started run (\d+)")


class DeploymentError(RuntimeError):
    """The deployment could not start, or a run did not finish as it should."""


class InsecureDeploymentWarning(UserWarning):
    """A SuperLink started without TLS: traffic and node identities are unprotected."""


INSECURE_WARNING = (
    "starting Flower without TLS (--insecure): models, updates and the Control API "
    "travel in clear text and any process that can reach the Fleet API can join as a "
    "SuperNode; use this only on a trusted loopback"
)


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
    """A ``flower-superlink`` on this machine and the ``flwr`` CLI pointed at it.

    Parameters
    ----------
    workdir : pathlib.Path
        The run folder: ``FLWR_HOME``, database, logs, ``certs/``.
    simulation : bool
        Start it with ``--simulation`` (Flower's simulation engine runs the ClientApps
        on Ray) instead of serving SuperNodes over the gRPC Fleet API.
    host : str
        The address the Control and Runtime HTTP APIs bind to (the ``flwr`` CLI and
        the ServerApp process connect there); loopback by default.
    startup_timeout : float
        Seconds to wait for its ports.
    insecure : bool
        No TLS (``--insecure``); warns with :class:`InsecureDeploymentWarning`.
    fleet_host : str, optional
        The address the Fleet API (gRPC, SuperNodes connect there) binds to; default
        ``host``. A shaped network's :attr:`~fedsync.deploy.netns.ShapedNetwork.server_address`.
    tls_hosts : sequence of str
        Extra subject alternative names for the server certificate (``host`` and
        ``fleet_host`` are always added).
    node_auth : bool
        ``--enable-supernode-auth``: only SuperNodes whose key was registered
        (:meth:`register_node`) may join. Needs TLS.
    """

    workdir: Path
    simulation: bool = False
    host: str = "127.0.0.1"
    startup_timeout: float = 60.0
    insecure: bool = False
    fleet_host: str | None = None
    tls_hosts: Sequence[str] = ()
    node_auth: bool = False
    process: ManagedProcess | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.node_auth and self.insecure:
            raise ValueError("SuperNode authentication needs TLS: node_auth with insecure=True")
        if self.node_auth and self.simulation:
            raise ValueError("SuperNode authentication has no meaning with simulation=True")
        self.workdir = self.workdir.resolve()
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.fleet_host = self.fleet_host or self.host
        self.tls: TlsFiles | None = (
            None if self.insecure else TlsFiles.in_folder(self.workdir / "certs")
        )
        self.fleet_port = free_port(self.fleet_host)
        self.control_port = free_port(self.host)
        self.http_port = free_port(self.host)

    @property
    def fleet_address(self) -> str:
        """``host:port`` of the Fleet API, what SuperNodes dial."""
        return f"{self.fleet_host}:{self.fleet_port}"

    def env(self) -> dict[str, str]:
        """The environment every Flower process of this run folder runs with."""
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(self.flwr_home),
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            FLWR_DISABLE_UPDATE_CHECK="1",
            PYTHONUNBUFFERED="1",
        )
        # The simulation engine calls ray.init() without an address, which attaches to
        # the last cluster `ray start` left in /tmp/ray (and hangs on a stale one). A
        # simulation starts its own Ray unless RAY_ADDRESS names a cluster to attach to.
        env.setdefault("RAY_ADDRESS", "local")
        # Ray's driver warns at every start that a future Ray will stop hiding GPUs from
        # actors given none; nothing a user of this run can act on (the behaviour kept
        # is the current one), so the warning is filtered, not the behaviour changed.
        quiet = "ignore::FutureWarning:ray._private.worker"
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), quiet]))
        return env

    def start(self) -> LocalSuperLink:
        """Start the SuperLink and wait until its ports accept connections."""
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        if self.tls is not None:
            generate_certificates(
                self.tls.ca_cert.parent, hosts=self._certificate_hosts(), overwrite=False
            )
        else:
            warnings.warn(INSECURE_WARNING, InsecureDeploymentWarning, stacklevel=2)
        self._write_cli_config()
        self.process = start_process(
            "superlink", self.command(), log_path=self.logs / "superlink.log", env=self.env()
        )
        try:
            if not self.simulation:
                assert self.fleet_host is not None
                wait_for_port(self.fleet_host, self.fleet_port, self.startup_timeout, self.process)
            wait_for_port(self.host, self.http_port, self.startup_timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def command(self) -> list[str]:
        """The ``flower-superlink`` command line :meth:`start` runs."""
        command = [
            _flwr_bin("flower-superlink"),
            *(["--insecure"] if self.tls is None else self.tls.superlink_args()),
            "--host",
            self.host,
            "--port",
            str(self.http_port),
            "--database",
            str(self.workdir / "superlink.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.node_auth:
            command.append("--enable-supernode-auth")
        if self.simulation:
            command.append("--simulation")
        else:
            command += ["--fleet-api-address", self.fleet_address]
        return command

    def stop(self) -> None:
        """Stop the SuperLink (and the ServerApp process it spawned)."""
        if self.process is not None:
            self.process.stop(grace=10.0)

    def register_node(self, key: NodeKey, name: str = "") -> int:
        """Register a SuperNode's public key (``flwr supernode register``); its node id.

        Raises
        ------
        fedsync.deploy.auth.RegistrationError
            When the SuperLink refuses it or cannot be reached.
        """
        return register_node(
            key, flwr=_flwr_bin("flwr"), connection=CONNECTION, env=self.env(), name=name
        )

    def supernode_args(self) -> list[str]:
        """Connection flags of a ``flower-supernode`` for this SuperLink (no key)."""
        security = ["--insecure"] if self.tls is None else self.tls.supernode_args()
        return [*security, "--superlink", self.fleet_address]

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

    def _certificate_hosts(self) -> list[str]:
        hosts = [self.host, self.fleet_host or "", *self.tls_hosts]
        # 0.0.0.0 / :: are bind-all addresses, never what a client dials.
        return [h for h in dict.fromkeys(hosts) if h and h not in ("0.0.0.0", "::")]

    def _write_cli_config(self) -> None:
        # The flwr CLI reads connections from $FLWR_HOME/config.toml; an explicit
        # address makes it talk to this SuperLink instead of starting its own.
        security = (
            "insecure = true\n"
            if self.tls is None
            else f"root-certificates = {json.dumps(str(self.tls.ca_cert))}\n"
        )
        (self.flwr_home / "config.toml").write_text(
            "[superlink]\n"
            f'default = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "{self.host}:{self.http_port}"\n' + security,
            encoding="utf-8",
        )


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine over gRPC, started and stopped by pid.

    Secure by default: TLS, and each SuperNode authenticated by its own registered key.

    Parameters
    ----------
    workdir : pathlib.Path
        The run folder: FLWR_HOME, database, logs, ``certs/``, ``keys/``.
    node_configs : sequence of mapping
        One node config per SuperNode (``partition-id``, ``num-partitions``,
        ``device``, ...).
    host : str
        The address the SuperLink's Control/Runtime HTTP APIs (and, without a
        ``network``, its Fleet API and the SuperNodes' ClientApp runtime) bind to.
    insecure : bool
        No TLS and no node authentication (warns).
    node_auth : bool, optional
        Authenticate SuperNodes by key (default: on with TLS, off when insecure).
    network : ShapedNetwork, optional
        A *created* network with one link per node: SuperNode ``i`` runs in link
        ``i``'s namespace and dials the Fleet API at the network's server address.
        The caller creates and destroys it (after :meth:`stop`).
    tls_hosts : sequence of str
        Extra SANs for the server certificate.
    max_wait_time : float
        A SuperNode gives up on an unreachable SuperLink after this many seconds.
    """

    workdir: Path
    node_configs: Sequence[Mapping[str, Any]]
    host: str = "127.0.0.1"
    insecure: bool = False
    node_auth: bool | None = None
    network: ShapedNetwork | None = None
    tls_hosts: Sequence[str] = ()
    max_wait_time: float = 120.0
    supernodes: list[ManagedProcess] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.node_configs:
            raise ValueError("a deployment needs at least one SuperNode node config")
        if self.node_auth is None:
            self.node_auth = not self.insecure
        if self.network is not None and len(self.network.shapes) != len(self.node_configs):
            raise ValueError(
                f"the network has {len(self.network.shapes)} links for "
                f"{len(self.node_configs)} SuperNodes"
            )
        self.link = LocalSuperLink(
            self.workdir,
            simulation=False,
            host=self.host,
            insecure=self.insecure,
            fleet_host=self.network.server_address if self.network is not None else None,
            tls_hosts=self.tls_hosts,
            node_auth=bool(self.node_auth),
        )
        self.node_keys: list[NodeKey] = []
        """Each SuperNode's key pair (empty without node authentication)."""
        self.node_ids: dict[int, int] = {}
        """SuperNode index -> the Flower node id its key was registered under."""

    def start(self) -> LocalDeployment:
        """Start the SuperLink, register the nodes' keys, then start every SuperNode."""
        if self.network is not None and len(self.network.links) != len(self.node_configs):
            raise DeploymentError("the shaped network must be created before start()")
        self.link.start()
        try:
            if self.node_auth:
                self._register_nodes()
            for index in range(len(self.node_configs)):
                self.supernodes.append(self.start_supernode(index))
        except BaseException:
            self.stop()
            raise
        return self

    def _register_nodes(self) -> None:
        """Give every node a key and register it; a reused run folder keeps both."""
        keys = self.link.workdir / "keys"
        known_path = keys / "node-ids.json"
        # public key line -> node id, for run folders (and SuperLink databases) reused.
        known: dict[str, int] = json.loads(known_path.read_text()) if known_path.is_file() else {}
        self.node_keys.clear()
        self.node_ids.clear()
        for index in range(len(self.node_configs)):
            key = generate_node_key(keys / f"supernode-{index}", comment=f"supernode-{index}")
            line = key.public_key.read_text().split()[1]
            try:
                node_id = self.link.register_node(key, f"supernode-{index}")
            except AlreadyRegistered:
                if line not in known:
                    raise
                node_id = known[line]
            known[line] = node_id
            self.node_keys.append(key)
            self.node_ids[index] = node_id
        known_path.write_text(json.dumps(known, indent=1) + "\n")

    def start_supernode(
        self, index: int, *, key: NodeKey | None = None, name: str | None = None
    ) -> ManagedProcess:
        """Start (or restart) the SuperNode with node config ``node_configs[index]``.

        Parameters
        ----------
        index : int
            Which node config (and, with a network, which namespace and link).
        key : NodeKey, optional
            Authenticate with this key instead of the node's registered one (a test of
            refusal passes an unregistered key).
        name : str, optional
            Process and log name (default ``supernode-<index>``).
        """
        name = name or f"supernode-{index}"
        # Timestamped lines: the per-task phases of a SuperNode are measured from them.
        return start_process(
            name,
            self.supernode_command(index, key=key),
            log_path=self.link.logs / f"{name}.log",
            env=self.link.env(),
            timestamps=True,
        )

    def supernode_command(self, index: int, *, key: NodeKey | None = None) -> list[str]:
        """The command line :meth:`start_supernode` runs (see there)."""
        if key is None and self.node_auth:
            if index >= len(self.node_keys):
                raise DeploymentError(f"SuperNode {index} has no registered key: start() first")
            key = self.node_keys[index]
        command = [
            _flwr_bin("flower-supernode"),
            *self.link.supernode_args(),
            *(key.supernode_args() if key is not None else []),
            # The ClientApp runtime API; in a namespace this is the namespace's loopback.
            "--host",
            self.host if self.network is None else "127.0.0.1",
            "--port",
            str(free_port(self.host)),
            "--node-config",
            _config_string(self.node_configs[index]),
            # Give up on a SuperLink that is gone instead of retrying forever.
            "--max-wait-time",
            f"{self.max_wait_time:g}",
        ]
        if self.network is not None:
            command = self.network.links[index].wrap(command)
        return command

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


UNACTIONABLE_LINES = ("Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",)
"""Lines of Flower's that a run streams to the terminal but a user cannot act on (the
federation size is always set here); they stay in the run's log file."""


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
        try:
            for line in cli.stdout:
                lines.append(line)
                log_file.write(line)
                if echo and not any(text in line for text in UNACTIONABLE_LINES):
                    print(line, end="", flush=True)
                if time.monotonic() > deadline:
                    raise DeploymentError(f"{command[1]} did not finish within {timeout:.0f}s")
        except BaseException:
            # A timeout, Ctrl-C or SIGTERM: Popen's exit would wait for the CLI, which
            # streams until the run ends.
            cli.kill()
            raise
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
