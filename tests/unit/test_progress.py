"""Progress bars' inputs: the growing event log, the run state read from it, budgets, and
staying quiet in CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsync.reports.progress_bar import LoopProgress, interactive, track
from fedsync.simulations.progress import ComparisonProgress, EventTail, RunState, budget_of


def test_the_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # not written yet
    with path.open("w") as file:
        file.write(json.dumps({"event": "a"}) + "\n" + '{"event": "b"')
    assert tail.read() == [{"event": "a"}]
    with path.open("a") as file:
        file.write(', "x": 1}\n')
    assert tail.read() == [{"event": "b", "x": 1}]
    assert tail.read() == []


def test_the_state_follows_rounds_aggregations_and_evaluations() -> None:
    state = RunState()
    state.update(
        [
            {"event": "train_round", "round": 3},
            {"event": "aggregation", "version": 2},
            {"event": "evaluation", "accuracy": 0.5, "sim_time": 12.25},
        ]
    )
    assert state.done == 3
    assert state.describe() == "acc 0.5000  sim 12.2 s"


def test_the_budget_is_rounds_or_aggregations() -> None:
    assert budget_of({"strategy": "fedavg", "num-rounds": 7}) == 7
    assert budget_of({"strategy": "teasq", "max-aggregations": 40}) == 40


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_quiet_in_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert interactive() is False
    assert ComparisonProgress({"a": 3}).enabled is False


def test_bars_follow_a_run_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with ComparisonProgress({"teasq": 4}, enabled=False) as bars:
        bars.watch("teasq", path)
        path.write_text(
            "\n".join(
                json.dumps(e)
                for e in (
                    {"event": "aggregation", "version": 4},
                    {"event": "evaluation", "accuracy": 0.9, "sim_time": 3.0},
                )
            )
            + "\n"
        )
        bars.finish("teasq", "finished:completed")
    assert bars.states["teasq"].done == 4
    assert bars.states["teasq"].accuracy == 0.9


def test_the_loop_bar_keeps_the_latest_evaluation_and_is_quiet_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    bar = LoopProgress(10, "teasq")
    assert bar.enabled is False
    bar.update(1)
    bar.update(2, accuracy=0.75, sim_time=3.5)
    bar.update(3)
    assert bar.status == "acc 0.7500  sim 3.5 s"
    bar.close()
    bar.close()


def test_track_yields_every_item_and_draws_nothing_in_ci(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")
    assert list(track(iter([3, 1, 2]), "items")) == [3, 1, 2]
    assert capsys.readouterr().out == ""
