"""The real app in Flower's simulation engine (a SuperLink with --simulation, Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig
from fedsync.recipe import model_for, model_state
from fedsync.reports import read_events
from tests.integration.conftest import run_simulation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_fedavg_simulation_learns_and_counts_bytes(tmp_path: Path, project_root: Path) -> None:
    folder = run_simulation(
        tmp_path,
        project_root,
        {"strategy": "fedavg", "num-rounds": 2, "local-epochs": 1, "fraction-evaluate": 0.5},
    )

    summary = json.loads((folder / "summary.json").read_text())
    accuracies = [r["accuracy"] for r in summary["evaluations"]]
    assert len(accuracies) == 3  # the initial model, then two rounds
    assert accuracies[-1] > accuracies[0] + 0.2
    # Bytes are counted as every strategy's: the length of the frame of the arrays the
    # real messages carry (none+fp32), 3 nodes x the model each way.
    round_events = list(read_events(folder / "events.jsonl", "train_round"))
    assert [e["replies"] for e in round_events] == [3, 3]
    model_bytes = round_events[0]["bytes_down"] // 3
    model = model_for(RunConfig.from_run_config({"local-epochs": 1}).training)
    assert model_bytes == len(UpdateCodec("none+fp32").encode(model_state(model)))
    assert all(e["bytes_up"] == e["bytes_down"] == 3 * model_bytes for e in round_events)
    assert summary["total_bytes_up"] == 6 * model_bytes
    assert (folder / "accuracy.png").stat().st_size > 0
