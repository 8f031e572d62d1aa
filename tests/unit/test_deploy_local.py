"""The deployment's command lines and CLI config: secure by default (no process starts)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedsync.deploy.auth import AlreadyRegistered, NodeKey, generate_node_key
from fedsync.deploy.local import DeploymentError, LocalDeployment, LocalSuperLink
from fedsync.deploy.netns import LinkShape
from tests.unit.loopback_network import LoopbackNetwork

NODES = [{"partition-id": i, "num-partitions": 2} for i in range(2)]


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_superlink_serves_tls_by_default(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path, node_auth=True)
    command = link.command()
    assert "--insecure" not in command
    assert _flag(command, "--ssl-certfile") == str(tmp_path.resolve() / "certs" / "server.pem")
    assert _flag(command, "--ssl-keyfile") == str(tmp_path.resolve() / "certs" / "server.key")
    assert _flag(command, "--ssl-ca-certfile") == str(tmp_path.resolve() / "certs" / "ca.crt")
    assert "--enable-supernode-auth" in command
    assert _flag(command, "--fleet-api-address") == link.fleet_address
    assert link.supernode_args() == [
        "--root-certificates",
        str(tmp_path.resolve() / "certs" / "ca.crt"),
        "--superlink",
        link.fleet_address,
    ]


def test_cli_connection_uses_the_ca_not_insecure(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path)
    link.flwr_home.mkdir(parents=True)
    link._write_cli_config()
    config = tomllib.loads((link.flwr_home / "config.toml").read_text())
    connection = config["superlink"]["local-deploy"]
    assert connection == {
        "address": f"127.0.0.1:{link.http_port}",
        "root-certificates": str(tmp_path.resolve() / "certs" / "ca.crt"),
    }


def test_insecure_is_explicit(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path, insecure=True)
    assert link.tls is None
    assert "--insecure" in link.command()
    assert link.supernode_args()[0] == "--insecure"
    link.flwr_home.mkdir(parents=True)
    link._write_cli_config()
    connection = tomllib.loads((link.flwr_home / "config.toml").read_text())["superlink"]
    assert connection["local-deploy"]["insecure"] is True


def test_node_auth_needs_tls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        LocalSuperLink(tmp_path, insecure=True, node_auth=True)
    with pytest.raises(ValueError, match="needs TLS"):
        LocalDeployment(tmp_path, NODES, insecure=True, node_auth=True)
    assert LocalDeployment(tmp_path, NODES).node_auth is True
    assert LocalDeployment(tmp_path, NODES, insecure=True).node_auth is False


def test_certificate_names_every_address_dialled(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path, host="127.0.0.1", tls_hosts=["superlink.lan", "127.0.0.1"])
    assert link._certificate_hosts() == ["127.0.0.1", "superlink.lan"]


def test_supernode_command_carries_key_and_ca(tmp_path: Path) -> None:
    deployment = LocalDeployment(tmp_path, NODES)
    with pytest.raises(DeploymentError, match="start"):
        deployment.supernode_command(0)  # keys exist only once start() registered them
    deployment.node_keys = [generate_node_key(tmp_path / f"k{i}") for i in range(2)]
    command = deployment.supernode_command(1)
    key = deployment.node_keys[1].private_key
    assert _flag(command, "--auth-supernode-private-key") == str(key)
    assert _flag(command, "--root-certificates").endswith("ca.crt")
    assert _flag(command, "--superlink") == deployment.link.fleet_address
    assert _flag(command, "--node-config") == "partition-id=1 num-partitions=2"
    stranger = generate_node_key(tmp_path / "stranger")
    command = deployment.supernode_command(0, key=stranger)
    assert _flag(command, "--auth-supernode-private-key") == str(stranger.private_key)


def test_supernodes_run_in_their_namespaces(tmp_path: Path) -> None:
    network = LoopbackNetwork([LinkShape.symmetric(1), None])
    deployment = LocalDeployment(tmp_path, NODES, network=network)  # type: ignore[arg-type]
    deployment.node_keys = [generate_node_key(tmp_path / f"k{i}") for i in range(2)]
    command = deployment.supernode_command(1)
    assert command[1:4] == ["netns", "exec", "fedsync-t-1"]
    assert _flag(command, "--host") == "127.0.0.1"
    assert deployment.link.fleet_host == network.server_address
    with pytest.raises(ValueError, match="links"):
        LocalDeployment(tmp_path, NODES[:1], network=network)  # type: ignore[arg-type]


def test_a_reused_run_folder_keeps_keys_and_node_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: dict[str, int] = {}

    def register(self: LocalSuperLink, key: NodeKey, name: str = "") -> int:
        line = key.public_key.read_text()
        if line in registered:
            raise AlreadyRegistered("[code: 23] Public key already in use.")
        registered[line] = 100 + len(registered)
        return registered[line]

    monkeypatch.setattr(LocalSuperLink, "register_node", register)
    first = LocalDeployment(tmp_path, NODES)
    first._register_nodes()
    assert first.node_ids == {0: 100, 1: 101}
    again = LocalDeployment(tmp_path, NODES)  # same folder, same SuperLink database
    again._register_nodes()
    assert again.node_ids == first.node_ids
    assert [k.private_key for k in again.node_keys] == [k.private_key for k in first.node_keys]
    registered.clear()  # a fresh database: registered anew, new ids
    registered["other"] = 0
    fresh = LocalDeployment(tmp_path, NODES)
    fresh._register_nodes()
    assert fresh.node_ids == {0: 101, 1: 102}
