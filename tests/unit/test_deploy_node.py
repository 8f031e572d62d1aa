"""``fedsync-node``'s command lines: what it adds to flower-supernode, and what it refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import flwr
import pytest

from fedsync.deploy.auth import generate_node_key
from fedsync.deploy.node import (
    DEFAULT_SUPERNODE_POLL,
    NodeArgumentError,
    node_commands,
    supernode_poll,
)
from fedsync.deploy.warm import WarmLocalDeployment

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


def test_the_short_poll_is_the_default_on_the_flower_that_takes_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No flag: the short poll on Flower 1.39; on another Flower, Flower's own poll and
    one line saying what that costs. A value asked for is used as it is."""
    assert supernode_poll(None) == DEFAULT_SUPERNODE_POLL == 0.1
    assert (supernode_poll(0.0), supernode_poll(1.5)) == (0.0, 1.5)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(flwr, "__version__", "1.42.0")
    assert supernode_poll(None) == 0.0
    said = capsys.readouterr().err
    assert "supports Flower 1.39 only, found 1.42.0" in said and "3 s" in said


def test_a_warm_deployment_runs_fedsync_node_with_its_defaults(tmp_path: Path) -> None:
    key = generate_node_key(tmp_path / "k0")
    as_shipped = WarmLocalDeployment(tmp_path, [{"partition-id": 0, "num-partitions": 1}])
    assert "--supernode-poll" not in as_shipped.supernode_command(0, key=key)
    flowers = WarmLocalDeployment(tmp_path, [{}], supernode_poll=0.0)
    command = flowers.supernode_command(0, key=key)
    assert command[command.index("--supernode-poll") + 1] == "0"
