"""Task phases from a SuperNode's timestamped log joined with the server's event log."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fedsync.deploy.timing import (
    parse_supernode_log,
    server_clock_offset,
    summarize,
    task_timings,
)
from fedsync.reports import read_events

_GREEN = "\x1b[92mINFO \x1b[0m:      "


def _node_log(path: Path, node_id: int, messages: list[tuple[str, float]]) -> None:
    lines = [f"100.000 {_GREEN}SuperNode ID: {node_id}"]
    for kind, start in messages:
        lines += [
            f"{start:.3f} {_GREEN}Receiving: {kind} message (ID: ab)",
            f"{start + 0.5:.3f} {_GREEN}Received successfully",
            f"{start + 4.5:.3f} {_GREEN}Sending: {kind} message (ID: cd)",
            f"{start + 4.75:.3f} {_GREEN}Sent successfully",
            "a line without a time stamp",
        ]
    path.write_text("\n".join(lines) + "\n")


def _events(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_parse_supernode_log(tmp_path: Path) -> None:
    log = tmp_path / "n.log"
    _node_log(log, 7, [("query", 200.0), ("train", 210.0)])
    node_id, messages = parse_supernode_log(log)
    assert node_id == 7
    assert [m.kind for m in messages] == ["query", "train"]
    train = messages[1]
    assert (train.receiving, train.received, train.sending, train.sent) == (
        210.0,
        210.5,
        214.5,
        214.75,
    )
    assert train.complete


def test_task_phases_add_up_to_the_round_trip(tmp_path: Path) -> None:
    logs = [tmp_path / "n0.log", tmp_path / "n1.log"]
    _node_log(logs[0], 7, [("query", 200.0), ("train", 210.0), ("train", 230.0)])
    _node_log(logs[1], 9, [("query", 200.0), ("train", 211.0)])
    _events(
        tmp_path / "events.jsonl",
        [
            {"event": "dispatch", "task": "t1", "node": 7},
            {"event": "dispatch", "task": "t2", "node": 9},
            {"event": "arrival", "task": "t1", "node": 7, "sim_duration": 6.0,
             "wall_compute_s": 1.5, "bytes_down": 1000, "bytes_up": 100, "num_examples": 50},
            {"event": "dispatch", "task": "t3", "node": 7},
            # t2 failed: an error instead of an arrival; t3 arrived.
            {"event": "error", "task": "t2", "node": 9},
            {"event": "arrival", "task": "t3", "node": 7, "sim_duration": 5.0,
             "wall_compute_s": 1.0, "bytes_down": 1000, "bytes_up": 90, "num_examples": 50},
        ],
    )  # fmt: skip
    timings = task_timings(tmp_path / "events.jsonl", logs)
    assert [(t.task, t.node_index, t.node_id) for t in timings] == [("t1", 0, 7), ("t3", 0, 7)]
    first = timings[0]
    assert first.download_s == pytest.approx(0.5)
    assert first.clientapp_s == pytest.approx(4.0)
    assert first.upload_s == pytest.approx(0.25)
    assert first.outside_s == pytest.approx(6.0 - 4.75)
    assert first.clientapp_overhead_s == pytest.approx(2.5)
    total = first.outside_s + first.download_s + first.clientapp_s + first.upload_s
    assert total == pytest.approx(first.round_trip_s)
    assert first.examples == 50

    summary = summarize(timings)
    assert summary["tasks"] == 2 and summary["bytes_up"] == 190
    assert summary["round_trip_s"]["mean"] == pytest.approx(5.5)
    assert summarize([]) == {"tasks": 0}


def _superlink_log(path: Path, pushes: list[float]) -> None:
    """The SuperLink's access log: a push-messages line per Unix time, among others."""
    lines = [f"{_GREEN}Starting Flower SuperLink"]
    for when in pushes:
        stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        lines += [
            f'{stamp}Z INFO [uvicorn.access] 127.0.0.1:1 - "POST /v1/runtime/push-messages '
            'HTTP/1.1" 200',
            f'{stamp}Z INFO [uvicorn.access] 127.0.0.1:1 - "POST /v1/runtime/pull-messages '
            'HTTP/1.1" 200',
        ]
    path.write_text("\n".join(lines) + "\n")


def test_outside_splits_into_poll_wait_and_pull_lag_with_server_times(tmp_path: Path) -> None:
    logs = [tmp_path / "n0.log", tmp_path / "n1.log"]
    _node_log(logs[0], 7, [("query", 200.0), ("train", 210.0), ("train", 230.0)])
    _node_log(logs[1], 9, [("query", 200.0), ("train", 212.0)])
    # The server's clock is Unix time - 200 here; the SuperLink logged the probe's push
    # and then one push per dispatch. t1's reply is taken 0.25 s after its Sent, t2's
    # 3 s after (behind a slow upload), t3's 1 s after.
    _superlink_log(tmp_path / "superlink.log", [205.0, 209.0, 209.01, 227.0])
    work = {"wall_compute_s": 1.0, "bytes_down": 10, "bytes_up": 10, "num_examples": 5}
    _events(
        tmp_path / "events.jsonl",
        [
            {"event": "dispatch", "task": "t1", "node": 7, "wall_time": 9.0},
            {"event": "dispatch", "task": "t2", "node": 9, "wall_time": 9.01},
            {"event": "arrival", "task": "t1", "node": 7, "wall_time": 15.0,
             "sim_duration": 6.0, **work},
            {"event": "dispatch", "task": "t3", "node": 7, "wall_time": 27.0},
            {"event": "arrival", "task": "t2", "node": 9, "wall_time": 19.75,
             "sim_duration": 10.74, **work},
            {"event": "arrival", "task": "t3", "node": 7, "wall_time": 35.75,
             "sim_duration": 8.75, **work},
        ],
    )  # fmt: skip
    assert server_clock_offset(
        tmp_path / "superlink.log", list(read_events(tmp_path / "events.jsonl"))
    ) == pytest.approx(200.0, abs=1e-3)
    timings = {
        t.task: t for t in task_timings(tmp_path / "events.jsonl", logs, tmp_path / "superlink.log")
    }
    # (poll wait, pull lag): dispatch -> Receiving, Sent -> arrival.
    expected = {"t1": (1.0, 0.25), "t2": (2.99, 3.0), "t3": (3.0, 1.0)}
    for task, (poll_wait, pull_lag) in expected.items():
        timing = timings[task]
        assert timing.pull_lag_s == pytest.approx(pull_lag, abs=1e-3)
        assert timing.poll_wait_s == pytest.approx(poll_wait, abs=1e-3)
    assert summarize(timings.values())["pull_lag_s"]["max"] == pytest.approx(3.0, abs=1e-3)


def test_a_log_without_one_push_per_dispatch_gives_no_split(tmp_path: Path) -> None:
    events = [
        {"event": "dispatch", "task": "t1", "node": 7, "wall_time": 1.0},
        {"event": "dispatch", "task": "t2", "node": 9, "wall_time": 5.0},
    ]
    # One push for both (a synchronous round), and a missing log: no join.
    _superlink_log(tmp_path / "one.log", [100.0, 101.0])
    assert server_clock_offset(tmp_path / "one.log", events) is None
    assert server_clock_offset(tmp_path / "absent.log", events) is None


def test_without_server_times_outside_stays_whole(tmp_path: Path) -> None:
    log = tmp_path / "n0.log"
    _node_log(log, 7, [("query", 200.0), ("train", 210.0)])
    _events(
        tmp_path / "events.jsonl",
        [
            {"event": "dispatch", "task": "t1", "node": 7},
            {"event": "arrival", "task": "t1", "node": 7, "sim_duration": 6.0,
             "bytes_down": 10, "bytes_up": 10},
        ],
    )  # fmt: skip
    (timing,) = task_timings(tmp_path / "events.jsonl", [log])
    assert timing.pull_lag_s is None and timing.poll_wait_s is None
    assert timing.as_dict()["pull_lag_s"] is None
    assert "pull_lag_s" not in summarize([timing])
