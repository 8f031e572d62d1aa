"""Upload against compute time per task, read from an asynchronous run's event log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsync.clock import load_fleet
from fedsync.simulations.linkbound import bytes_by_kind, device_loads, main, summarize


def _log(path: Path, arrivals: list[tuple[int, int, int]], **run_config: object) -> Path:
    """An event log of three iot-100 devices (fast, mid, slow) and these
    ``(device, bytes_up, num_examples)`` arrivals."""
    config = {"local-epochs": 3, "batch-size": 32, "local-steps": 0, **run_config}
    events = [
        {"event": "run_start", "run_config": config},
        {"event": "async_start", "fleet": "iot-100", "profiles": ["fast", "mid", "slow"]},
    ] + [
        {"event": "arrival", "device": d, "bytes_up": up, "num_examples": n, "sim_time": 1.0}
        for d, up, n in arrivals
    ]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return path


def test_compute_and_upload_come_from_the_fleet_profile(tmp_path: Path) -> None:
    profiles = {p.name: p for p, _ in load_fleet("iot-100").groups}
    log = _log(tmp_path / "e.jsonl", [(1, 1000, 600), (1, 3000, 600), (1, 2000, 600)])
    (mid,) = device_loads(log)
    # 3 epochs of ceil(600 / 32) = 19 steps; 1800 samples; the median payload, 2000 B.
    assert mid.compute_s == pytest.approx(profiles["mid"].compute_seconds(1800, 57))
    assert mid.upload_bytes == 2000
    assert mid.upload_s == pytest.approx(2000 * 8 / 128_000)
    assert mid.ratio == pytest.approx(mid.upload_s / mid.compute_s)


def test_a_step_cap_shortens_the_task(tmp_path: Path) -> None:
    log = _log(tmp_path / "e.jsonl", [(0, 1000, 5000)], **{"local-steps": 50, "local-epochs": 1})
    (fast,) = device_loads(log)
    profile = next(p for p, _ in load_fleet("iot-100").groups if p.name == "fast")
    assert fast.compute_s == pytest.approx(profile.compute_seconds(50 * 32, 50))


def test_the_median_device_is_the_median_by_compute(tmp_path: Path) -> None:
    log = _log(tmp_path / "e.jsonl", [(0, 247_000, 600), (1, 247_000, 600), (2, 247_000, 600)])
    summary = summarize(device_loads(log))
    assert summary["devices"] == 3
    assert summary["median_device"]["group"] == "mid"
    assert set(summary["groups"]) == {"fast", "mid", "slow"}
    out = tmp_path / "ratio.json"
    assert main([str(log), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["median_device"]["device"] == 1


def test_a_log_that_is_not_an_asynchronous_run_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "e.jsonl"
    log.write_text(json.dumps({"event": "run_start", "run_config": {}}) + "\n")
    with pytest.raises(ValueError, match="not an asynchronous run"):
        device_loads(log)
    assert main([str(log)]) == 2
    with pytest.raises(ValueError, match="no device"):
        summarize([])


def test_bytes_are_split_by_downlink_kind_up_to_a_time(tmp_path: Path) -> None:
    log = _log(tmp_path / "e.jsonl", [])
    extra = [
        {
            "event": "dispatch",
            "device": 0,
            "downlink_kind": "full",
            "bytes_down": 100,
            "sim_time": 0,
        },
        {
            "event": "dispatch",
            "device": 1,
            "downlink_kind": "full",
            "bytes_down": 100,
            "sim_time": 0,
        },
        {
            "event": "dispatch",
            "device": 0,
            "downlink_kind": "delta",
            "bytes_down": 10,
            "sim_time": 5,
        },
        {
            "event": "dispatch",
            "device": 2,
            "downlink_kind": "full",
            "bytes_down": 100,
            "sim_time": 9,
        },
        {"event": "arrival", "device": 0, "bytes_up": 7, "num_examples": 1, "sim_time": 4},
        {"event": "arrival", "device": 1, "bytes_up": 7, "num_examples": 1, "sim_time": 8},
    ]
    with log.open("a") as file:
        file.writelines(json.dumps(e) + "\n" for e in extra)
    spent = bytes_by_kind(log, until=6.0)
    assert spent["downlink"] == {
        "full": {"tasks": 2, "bytes": 200},
        "delta": {"tasks": 1, "bytes": 10},
    }
    assert spent["devices_reached"] == 2
    assert (spent["updates"], spent["uplink_bytes"]) == (1, 7)
    assert bytes_by_kind(log)["devices_reached"] == 3
