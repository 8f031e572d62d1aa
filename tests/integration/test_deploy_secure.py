"""Secure by default: TLS everywhere and only registered SuperNodes may join.

Real processes: ``flower-superlink`` with ``--ssl-*`` and ``--enable-supernode-auth``,
three SuperNodes with registered OpenSSH ECDSA keys, and two strangers -- one whose key
was never registered (Flower refuses it: ``[code: 2004] Failed to activate SuperNode``)
and one that trusts another CA (its TLS handshake fails) -- while the run completes with
the three registered nodes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedsync.deploy import (
    InsecureDeploymentWarning,
    LocalDeployment,
    LocalSuperLink,
    generate_certificates,
    generate_node_key,
)
from fedsync.deploy.processes import ManagedProcess, start_process
from fedsync.reports import read_events
from tests.integration.conftest import argv_after_exec, live_group_members

pytestmark = [pytest.mark.integration]


def _wait_exit(process: ManagedProcess, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return process.poll()


@pytest.mark.timeout(240)
def test_registered_nodes_run_strangers_are_refused(tmp_path: Path, project_root: Path) -> None:
    results = tmp_path / "results"
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    deployment = LocalDeployment(tmp_path / "run", nodes)
    deployment.start()
    pids = deployment.pids()
    strangers: list[ManagedProcess] = []
    try:
        assert deployment.link.process is not None
        link_cmd = argv_after_exec(deployment.link.process.pid)
        assert "--insecure" not in link_cmd
        assert {"--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile"} <= set(link_cmd)
        assert "--enable-supernode-auth" in link_cmd
        for node in deployment.supernodes:
            assert node.poll() is None, f"{node.name} exited: {node.log_path.read_text()}"
            node_cmd = argv_after_exec(node.pid)
            assert "--insecure" not in node_cmd
            assert {"--root-certificates", "--auth-supernode-private-key"} <= set(node_cmd)
        config = (deployment.link.flwr_home / "config.toml").read_text()
        assert "root-certificates" in config and "insecure" not in config

        # A well-configured node whose key nobody registered.
        unregistered = deployment.start_supernode(
            0, key=generate_node_key(tmp_path / "stranger"), name="supernode-unregistered"
        )
        strangers.append(unregistered)
        # A registered key, but the node trusts another CA: TLS must stop it.
        command = deployment.supernode_command(1)
        command[command.index("--root-certificates") + 1] = str(
            generate_certificates(tmp_path / "other-ca").ca_cert
        )
        wrong_ca = start_process(
            "supernode-wrong-ca",
            command,
            log_path=deployment.link.logs / "supernode-wrong-ca.log",
            env=deployment.link.env(),
        )
        strangers.append(wrong_ca)

        outcome = deployment.run_app(
            project_root,
            {
                "strategy": "teasq",
                "clock": "wall",
                "concurrency": 3,
                "buffer-size": 2,
                "max-aggregations": 2,
                "eval-every": 2,
                "min-nodes": 3,
                "local-epochs": 1,
                "plots": False,
                "results-dir": str(results),
                "run-name": "secure",
            },
            timeout=240,
        )
        unregistered_exit = _wait_exit(unregistered, 30)
        wrong_ca_exit = _wait_exit(wrong_ca, 30)
    finally:
        for stranger in strangers:
            stranger.stop(grace=2.0)
        deployment.stop()
    assert live_group_members(pids + [s.pid for s in strangers]) == []
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"

    assert unregistered_exit not in (None, 0)
    refused = (deployment.link.logs / "supernode-unregistered.log").read_text()
    assert "[code: 2004] Failed to activate SuperNode" in refused
    assert wrong_ca_exit not in (None, 0)
    assert (
        "CERTIFICATE_VERIFY_FAILED" in (deployment.link.logs / "supernode-wrong-ca.log").read_text()
    )

    # The run used exactly the three registered nodes.
    summary = json.loads((results / "secure" / "summary.json").read_text())
    assert summary["aggregations"] == 2
    (started,) = read_events(results / "secure" / "events.jsonl", "async_start")
    assert set(started["node_of_device"]) == set(deployment.node_ids.values())


@pytest.mark.timeout(120)
def test_insecure_mode_is_explicit_and_warns(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path / "run", insecure=True)
    with pytest.warns(InsecureDeploymentWarning, match="without TLS"):
        link.start()
    try:
        assert link.process is not None
        assert "--insecure" in argv_after_exec(link.process.pid)
        assert "insecure = true" in (link.flwr_home / "config.toml").read_text()
        assert not (tmp_path / "run" / "certs").exists()
    finally:
        link.stop()
    assert link.process is not None
    assert live_group_members([link.process.pid]) == []
