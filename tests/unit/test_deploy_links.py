"""Which nodes a shaped-link run starts in its namespaces (no namespace is built here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedsync.deploy.auth import generate_node_key
from fedsync.deploy.links import link_deployment, link_report, run_over_links
from fedsync.deploy.local import LocalDeployment, RunOutcome
from fedsync.deploy.netns import LinkShape
from fedsync.deploy.node import node_commands
from fedsync.deploy.warm import WarmLocalDeployment
from tests.unit.loopback_network import LoopbackNetwork

NODES = [{"partition-id": i, "num-partitions": 2} for i in range(2)]


def _deployment(tmp_path: Path, **kwargs: object) -> LocalDeployment:
    network = LoopbackNetwork([LinkShape.symmetric(1), LinkShape.symmetric(5)])
    deployment = link_deployment(tmp_path, NODES, network, **kwargs)  # type: ignore[arg-type]
    deployment.node_keys = [generate_node_key(tmp_path / f"k{i}") for i in range(2)]
    return deployment


def test_warm_nodes_run_whole_inside_their_namespaces(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path, nodes="warm", supernode_poll=0.2)
    assert isinstance(deployment, WarmLocalDeployment)
    command = deployment.supernode_command(1)
    # The namespace wrapper starts fedsync-node, whose SuperNode and executor are its
    # children: both inherit the namespace (and talk over its loopback).
    assert command[1:4] == ["netns", "exec", "fedsync-t-1"]
    assert command[4:7] == [sys.executable, "-m", "fedsync.deploy.node"]
    own = command[7 : command.index("--")]
    assert own[own.index("--supernode-poll") + 1] == "0.2"
    supernode_args = command[command.index("--") + 1 :]
    superlink = supernode_args[supernode_args.index("--superlink") + 1]
    assert superlink.startswith(f"{deployment.link.fleet_host}:")
    assert "partition-id=1" in supernode_args[supernode_args.index("--node-config") + 1]
    # What fedsync-node will do with them: accepted as they are (no --host/--port left).
    port = int(own[own.index("--runtime-port") + 1])
    supernode, executor = node_commands(supernode_args, runtime_port=port, supernode_poll=0.2)
    assert supernode[:3] == [sys.executable, "-m", "fedsync.deploy.fast_poll"]
    assert executor[executor.index("--runtime-api-address") + 1] == f"127.0.0.1:{port}"


def test_stock_nodes_are_flowers_own_supernodes(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path)
    assert type(deployment) is LocalDeployment
    command = deployment.supernode_command(0)
    assert command[1:4] == ["netns", "exec", "fedsync-t-0"]
    assert command[4].endswith("flower-supernode")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": "lukewarm"}, "nodes must be one of stock, warm"),
        ({"nodes": "stock", "supernode_poll": 0.2}, "needs warm nodes"),
        ({"nodes": "warm", "supernode_poll": -1.0}, ">= 0"),
        ({"nodes": "warm", "supernode_poll": float("nan")}, ">= 0"),
    ],
)
def test_bad_node_settings_are_refused_before_anything_is_built(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run_over_links(tmp_path, tmp_path, {}, [None], **kwargs)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("nodes", "poll", "says"), [("warm", 0.2, "warm executor"), ("stock", 0.0, "fresh")]
)
def test_the_report_says_how_the_nodes_ran(nodes: str, poll: float, says: str) -> None:
    outcome = RunOutcome(7, "finished:completed", "", "")
    report = link_report(
        links=[], shapes=[], traffic=[], supernode_logs=[], timings=[], fab_size=None,
        outcome=outcome, nodes=nodes, supernode_poll=poll,
    )  # fmt: skip
    assert (report["nodes"], report["supernode_poll_s"]) == (nodes, poll)
    assert says in report["notes"][1]
