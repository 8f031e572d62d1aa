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
        sys.executable, "-m", "fedsync.clients.node_exec",
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


def test_object_pulls_retry_at_the_given_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supercore.inflatable import inflatable_utils

    from fedsync.object_pulls import (
        LOCAL_PULL_RETRY_CAP_S,
        PULL_RETRY_CAP_S,
        shorten_object_pulls,
    )

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    for function in functions:  # Flower's own defaults (1 s, doubling to 10 s), restored after
        defaults = {
            **function.__kwdefaults__,
            "initial_backoff": 1,
            "backoff_cap": 10,
            "max_tries_per_object": 500,
            "max_time": 7200,
        }
        monkeypatch.setattr(function, "__kwdefaults__", defaults)
    assert shorten_object_pulls(0.01)
    for function in functions:
        assert function.__kwdefaults__["initial_backoff"] == 0.01
        assert function.__kwdefaults__["backoff_cap"] == PULL_RETRY_CAP_S
        # the 2 h limit still ends a pull, not 500 tries of at most 0.5 s
        assert function.__kwdefaults__["max_tries_per_object"] * PULL_RETRY_CAP_S > 7200
    # a pull that finds its object unavailable twice still gets it, retrying
    misses = iter([True, True, False])

    def pull(object_id: str) -> bytes:
        if next(misses):
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["obj"], pull) == {"obj": b"content"}
    # a reader on the objects' own host (ServerApp, warm executor) retries at most 0.1 s apart
    assert shorten_object_pulls(0.05, cap=LOCAL_PULL_RETRY_CAP_S)
    for function in functions:
        assert function.__kwdefaults__["backoff_cap"] == LOCAL_PULL_RETRY_CAP_S == 0.1
        assert function.__kwdefaults__["max_tries_per_object"] * LOCAL_PULL_RETRY_CAP_S > 7200
