"""Across machines, as near as one machine allows: SuperNodes in their own network namespaces.

Three SuperNodes, each in its own network namespace with its own address on its own
veth link (:class:`fedsync.deploy.netns.ShapedNetwork`, unshaped), reach the SuperLink
the way separate machines would: over a network interface, not the loopback. The
SuperLink's Fleet API listens on one routable address only, serves TLS with a
certificate that names that address (the one the nodes dial, checked through the
certificate's subject alternative names), and admits only SuperNodes whose keys were
registered. While a FedAvg run completes, the SuperLink's side of every Fleet API
connection shows a different node address. Skips where network namespaces are not
permitted (they need root, ``ip`` and veth support).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509

from fedsync.deploy import LocalDeployment, ShapedNetwork
from fedsync.deploy.proctree import alive
from fedsync.reports import read_events
from tests.integration.conftest import argv_after_exec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(360)]

NODES = 3
# Apart from the shaped-links test's range: both may run at the same time.
SUBNET = "10.217.0.0/24"


def _net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _wait_exec(pid: int, timeout: float = 30.0) -> None:
    """Wait until ``ip netns exec`` has entered the namespace and exec'd the SuperNode."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(os.readlink(f"/proc/{pid}/exe")).name != "ip":
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} is still 'ip netns exec' after {timeout:.0f}s")


def _fleet_peers(port: int) -> set[str]:
    """Remote addresses of established TCP connections to local port ``port`` (host ns)."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    peers = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            address = ipaddress.ip_address(fields[-1].rsplit(":", 1)[0].strip("[]"))
            # A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d.
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            peers.add(str(address))
    return peers


def _san_addresses(cert_path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(a) for a in san.get_values_for_type(x509.IPAddress)}


@pytest.mark.usefixtures("namespaces_allowed")
def test_supernodes_in_own_namespaces_over_tls_with_node_auth(
    tmp_path: Path, project_root: Path
) -> None:
    results = tmp_path / "results"
    network = ShapedNetwork([None] * NODES, subnet=SUBNET)
    nodes = [{"partition-id": i, "num-partitions": NODES} for i in range(NODES)]
    peers: set[str] = set()
    stop_watch = threading.Event()
    pids: list[int] = []
    deployment: LocalDeployment | None = None
    network.create()
    try:
        # After create(): the Fleet API's port is picked on the network's address.
        deployment = LocalDeployment(tmp_path / "run", nodes, network=network)
        addresses = {link_.node_address for link_ in network.links}
        namespaces = [link_.namespace for link_ in network.links]
        deployment.start()
        pids = deployment.pids()
        link = deployment.link
        server = network.server_address

        # The Fleet API is on the routable address only; the loopback has no listener.
        assert link.fleet_address == f"{server}:{link.fleet_port}"
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", link.fleet_port), 2):
            pass
        # TLS: the certificate names the address the nodes dial.
        assert link.tls is not None
        assert server in _san_addresses(link.tls.server_cert)
        assert ipaddress.ip_address(server) not in ipaddress.ip_network("127.0.0.0/8")

        host_ns = _net_namespace(os.getpid())
        node_namespaces = set()
        for index, node in enumerate(deployment.supernodes):
            assert node.poll() is None, node.log_path.read_text()
            _wait_exec(node.pid)
            argv = argv_after_exec(node.pid)
            assert argv[argv.index("--superlink") + 1] == link.fleet_address
            assert "--insecure" not in argv
            assert "--root-certificates" in argv
            assert "--auth-supernode-private-key" in argv
            namespace = _net_namespace(node.pid)
            assert namespace != host_ns
            node_namespaces.add(namespace)
            assert deployment.node_ids[index] > 0  # its key was registered
        assert len(node_namespaces) == NODES

        def watch() -> None:
            while not stop_watch.is_set():
                peers.update(_fleet_peers(link.fleet_port))
                stop_watch.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        outcome = deployment.run_app(
            project_root,
            {
                "strategy": "fedavg",
                "num-rounds": 2,
                "local-epochs": 1,
                "fraction-evaluate": 0.0,
                "min-train-nodes": NODES,
                "plots": False,
                "results-dir": str(results),
                "run-name": "netns",
            },
            timeout=200,
        )
        stop_watch.set()
        watcher.join(timeout=5)
    finally:
        stop_watch.set()
        if deployment is not None:
            deployment.stop()
        network.destroy()

    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    rounds = list(read_events(results / "netns" / "events.jsonl", "train_round"))
    assert [r["replies"] for r in rounds] == [NODES, NODES]
    summary = json.loads((results / "netns" / "summary.json").read_text())
    assert len(summary["evaluations"]) == 3
    # Every node talked to the SuperLink from its own address, none over the loopback.
    assert peers == addresses, peers
    # Nothing left: processes and namespaces.
    assert [pid for pid in pids if alive(pid)] == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [namespace for namespace in namespaces if namespace in listed]
