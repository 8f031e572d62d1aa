"""The real app over loopback gRPC: flower-superlink and three flower-supernode processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsync.deploy import LocalDeployment
from tests.integration.conftest import live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_fedavg_over_loopback_grpc(tmp_path: Path, project_root: Path) -> None:
    results = tmp_path / "results"
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    deployment = LocalDeployment(tmp_path / "run", nodes)
    deployment.start()
    pids = deployment.pids()
    try:
        assert len(pids) == 4
        outcome = deployment.run_app(
            project_root,
            {
                "num-rounds": 2,
                "local-epochs": 1,
                "min-train-nodes": 3,
                "results-dir": str(results),
                "run-name": "grpc",
            },
            timeout=480,
        )
    finally:
        deployment.stop()
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    assert live_group_members(pids) == []

    summary = json.loads((results / "grpc" / "summary.json").read_text())
    accuracies = [r["accuracy"] for r in summary["rounds"]]
    assert accuracies[-1] > accuracies[0] + 0.2
    assert summary["rounds"][-1]["bytes_up"] > 0
