"""The real app over loopback gRPC: flower-superlink and three flower-supernode processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsync.deploy import LocalDeployment, RunOutcome
from fedsync.reports import read_events
from tests.integration.conftest import live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def run_deployed(
    tmp_path: Path,
    project_root: Path,
    nodes: list[dict[str, int]],
    run_config: dict[str, object],
    *,
    timeout: float = 480,
) -> RunOutcome:
    """Start a loopback deployment (SuperLink and ``nodes``' SuperNodes), run the app to
    its end, stop everything, and assert that no process it started is left."""
    deployment = LocalDeployment(tmp_path / "run", nodes)
    deployment.start()
    pids = deployment.pids()
    try:
        assert len(pids) == len(nodes) + 1
        outcome = deployment.run_app(project_root, run_config, timeout=timeout)
    finally:
        deployment.stop()
    assert live_group_members(pids) == []
    return outcome


def test_fedavg_over_loopback_grpc(tmp_path: Path, project_root: Path) -> None:
    results = tmp_path / "results"
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    outcome = run_deployed(
        tmp_path,
        project_root,
        nodes,
        {
            "strategy": "fedavg",
            "num-rounds": 2,
            "local-epochs": 1,
            "min-train-nodes": 3,
            # Central evaluation only (what the test reads): federated evaluation would
            # start a ClientApp process on every node each round.
            "fraction-evaluate": 0.0,
            "probe-timeout": 0.0,  # devices by node id; saves a ClientApp start per node
            "results-dir": str(results),
            "run-name": "grpc",
        },
        timeout=480,
    )
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    summary = json.loads((results / "grpc" / "summary.json").read_text())
    accuracies = [r["accuracy"] for r in summary["evaluations"]]
    assert accuracies[-1] > accuracies[0] + 0.2
    assert summary["evaluations"][-1]["cumulative_bytes_up"] > 0


def test_teasq_over_loopback_grpc(tmp_path: Path, project_root: Path) -> None:
    """The asynchronous loop on the wall clock, against real SuperNodes over gRPC."""
    results = tmp_path / "results"
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    outcome = run_deployed(
        tmp_path,
        project_root,
        nodes,
        {
            "strategy": "teasq",
            "clock": "wall",
            "concurrency": 3,
            "buffer-size": 2,
            "max-aggregations": 4,
            "eval-every": 2,
            "min-nodes": 3,
            "local-epochs": 2,
            "probe-timeout": 0.0,  # devices by node id; saves a ClientApp start per node
            "results-dir": str(results),
            "run-name": "teasq",
        },
        timeout=480,
    )
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"

    summary = json.loads((results / "teasq" / "summary.json").read_text())
    assert summary["strategy"] == "teasq"
    assert summary["aggregations"] == 4
    assert summary["aggregated_updates"] == 8  # exactly K=2 per aggregation
    assert summary["errors_total"] == 0
    evaluations = [
        e for e in read_events(results / "teasq" / "events.jsonl") if e["event"] == "evaluation"
    ]
    assert evaluations[-1]["accuracy"] > evaluations[0]["accuracy"] + 0.2
    # Compressed both ways: far fewer bytes than the dense float32 model per task.
    assert summary["total_bytes_up"] < summary["total_bytes_down"]


def test_a_run_whose_nodes_all_fail_alike_fails_and_names_the_error(
    tmp_path: Path, project_root: Path
) -> None:
    """Two SuperNodes started with the same partition id, one their num-partitions cannot
    hold: every task fails on every node with the same error. The run must end failed
    (not as a completed run with exit 0), its status details and summary naming it."""
    results = tmp_path / "results"
    nodes = [{"partition-id": 5, "num-partitions": 2} for _ in range(2)]
    outcome = run_deployed(
        tmp_path,
        project_root,
        nodes,
        {
            "strategy": "teasq",
            "clock": "wall",
            "min-nodes": 2,
            "max-retries": 1,
            "probe-timeout": 10.0,
            "results-dir": str(results),
            "run-name": "broken",
        },
        timeout=300,
    )
    assert outcome.status == "finished:failed", f"{outcome.status} {outcome.output[-3000:]}"
    expected = "every one failed with the same error: clientapp-exception (code 2)"
    assert expected in outcome.details, outcome.details
    assert "partition-id must be in [0, num-partitions=2), got 5" in outcome.details
    summary = json.loads((results / "broken" / "summary.json").read_text())
    assert summary["stop_reason"] == "no-devices-left" and summary["aggregations"] == 0
    assert expected in summary["failure"]
