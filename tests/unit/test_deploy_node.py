"""``fedsync-node``'s command lines: what it adds to flower-supernode, and what it refuses."""

from __future__ import annotations

import sys

import pytest

from fedsync.deploy.node import NodeArgumentError, node_commands

LINK = ["--superlink", "10.0.0.1:9092", "--node-config", "partition-id=0 num-partitions=2"]


def test_supernode_gets_process_isolation_and_a_loopback_runtime_api() -> None:
    supernode, executor = node_commands(LINK, runtime_port=9094, executor_poll=0.1)
    assert supernode[0] == "flower-supernode" and supernode[1 : 1 + len(LINK)] == LINK
    assert supernode[len(LINK) + 1 :] == [
        "--isolation", "process", "--host", "127.0.0.1", "--port", "9094"
    ]  # fmt: skip
    assert executor == [
        sys.executable, "-m", "fedsync.clientapp.node_exec",
        "--runtime-api-address", "127.0.0.1:9094", "--poll", "0.1", "--supervise",
    ]  # fmt: skip


def test_a_shorter_poll_runs_the_supernode_through_the_launcher() -> None:
    supernode, _ = node_commands(LINK, runtime_port=9094, supernode_poll=0.2)
    assert supernode[:3] == [sys.executable, "-m", "fedsync.deploy.fast_poll"]


@pytest.mark.parametrize("flag", ["--isolation", "--host", "--port=9000"])
def test_flags_it_sets_itself_are_refused_by_name(flag: str) -> None:
    with pytest.raises(NodeArgumentError, match=flag.split("=")[0]):
        node_commands([*LINK, flag, "x"], runtime_port=9094)


def test_a_superlink_address_is_required_and_the_port_checked() -> None:
    with pytest.raises(NodeArgumentError, match="--superlink"):
        node_commands(["--insecure"], runtime_port=9094)
    with pytest.raises(NodeArgumentError, match="65535"):
        node_commands(LINK, runtime_port=70000)
