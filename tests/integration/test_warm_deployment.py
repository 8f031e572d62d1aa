"""Warm executors on a real loopback deployment (``WarmLocalDeployment``), a crash included.

Real flower-superlink and flower-supernode processes (``--isolation process``), each node
started by ``fedsync-node`` with its supervised warm executor (:mod:`fedsync.clientapp.node_exec`);
one executor is SIGKILLed while the run goes on. Every process is stopped by pid.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from fedsync.deploy.proctree import cmdline, descendants
from fedsync.deploy.timing import parse_supernode_log
from fedsync.deploy.warm import WarmLocalDeployment
from tests.integration.conftest import live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def test_warm_executors_run_a_job_and_survive_a_crash(tmp_path: Path, project_root: Path) -> None:
    results = tmp_path / "results"
    nodes = [
        {
            "partition-id": i,
            "num-partitions": 2,
            "device": "cpu",
            "device-class": "test-cpu",
            "state-dir": str(tmp_path / f"state-{i}"),
            "timing-log": str(tmp_path / f"timing-{i}.jsonl"),
        }
        for i in range(2)
    ]
    deployment = WarmLocalDeployment(tmp_path / "run", nodes)
    deployment.start()
    pids = deployment.pids()
    killed: list[int] = []

    def kill_after_first_task() -> None:
        log = deployment.link.logs / "supernode-0.log"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            _, messages = parse_supernode_log(log) if log.exists() else (None, [])
            if sum(1 for m in messages if m.kind == "train" and m.complete) >= 1:
                # fedsync-node -> the supervisor -> the executor it runs
                for pid in descendants(deployment.supernodes[0].pid):
                    argv = cmdline(pid)
                    if "fedsync.clientapp.node_exec" in argv and "--supervise" not in argv:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_first_task, daemon=True)
    killer.start()
    try:
        outcome = deployment.run_app(
            project_root,
            {
                "strategy": "fedasync",
                "clock": "wall",
                "concurrency": 2,
                "min-nodes": 2,
                "local-epochs": 1,
                # fedsync-node polls every 0.2 s: a task takes about a second, so the
                # run must be long enough to outlast node 0's executor restart (an
                # import of torch, seconds under load) by a margin: node 1 alone needs
                # 30 tasks, about 35 s, to end it.
                "max-aggregations": 30,
                "eval-every": 10,
                "probe-timeout": 120.0,  # the nodes' profiles go into the summary
                "plots": False,
                "results-dir": str(results),
                "run-name": "warm",
            },
            timeout=360,
        )
        killer.join(timeout=5)
    finally:
        deployment.stop()
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    assert live_group_members(pids) == []
    assert killed, "the executor of node 0 was never killed"
    assert "starting it again" in (deployment.link.logs / "supernode-0.log").read_text()

    summary = json.loads((results / "warm" / "summary.json").read_text())
    assert summary["aggregations"] == 30
    # Each node's declared class and device, next to its measured task times.
    devices = sorted(summary["devices"].values(), key=lambda d: d["device_index"])
    assert [(d["device_class"], d["device"]) for d in devices] == [("test-cpu", "cpu")] * 2
    assert all(d["task_seconds_median"] > 0 and d["compute_seconds_median"] > 0 for d in devices)
    # Node 0 went on after the crash: its timing log has lines from two executor processes.
    lines = [json.loads(x) for x in (tmp_path / "timing-0.jsonl").read_text().splitlines()]
    trains = [x for x in lines if x["message_type"] == "train"]
    assert len(trains) >= 2
    assert len({x["pid"] for x in trains}) >= 2
    assert {x["device_class"] for x in lines} == {"test-cpu"}
    assert {x["device"] for x in lines} == {"cpu"}
