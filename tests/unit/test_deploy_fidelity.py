"""The fidelity experiment's setup and calibration (no process starts)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedsync.clock import FleetSpec
from fedsync.deploy.fidelity import DEFAULT_SCENARIO, Calibration, FidelitySetup
from fedsync.deploy.netns import LinkShape
from fedsync.deploy.timing import TaskTiming


def _task(index: int, examples: int, compute: float, round_trip: float) -> TaskTiming:
    return TaskTiming(
        task=f"t{index}-{examples}",
        node_index=index,
        node_id=index,
        round_trip_s=round_trip,
        outside_s=1.0,
        download_s=0.1,
        clientapp_s=round_trip - 1.2,
        compute_s=compute,
        upload_s=0.1,
        bytes_down=125_000,
        bytes_up=12_500,
        examples=examples,
    )


def test_the_shipped_scenario_matches_its_fleet() -> None:
    setup = FidelitySetup.from_scenario(DEFAULT_SCENARIO)
    assert setup.name == "links-fidelity"
    assert setup.run_config["strategy"] == "teasq"
    assert [s.uplink_mbit for s in setup.shapes] == [1.0, 5.0, 20.0]
    assert setup.shapes == [LinkShape.symmetric(r) for r in (1.0, 5.0, 20.0)]
    assert 0.0 < setup.target <= 1.0


def test_compute_fit_and_overhead() -> None:
    # compute = 2 s cold start + 0.01 s per sample (epochs = 2: samples = 2 x examples).
    timings = [_task(0, n, 2.0 + 0.01 * 2 * n, 2.0 + 0.01 * 2 * n + 15.0) for n in (100, 300)]
    calibration = Calibration.from_timings(timings, epochs=2)
    assert calibration.seconds_per_sample == pytest.approx(0.01)
    assert calibration.cold_start_s == pytest.approx(2.0)
    assert calibration.overhead_s == pytest.approx(15.0)
    assert calibration.seconds_per_sample_flat == pytest.approx((4.0 + 8.0) / 800)


def test_modelled_transfers_leave_the_overhead() -> None:
    # 125 kB down + 12.5 kB up over 1 Mbit/s: 1.0 s + 0.1 s the simulator adds itself.
    timings = [_task(0, 100, 1.0, 20.0)]
    shaped = Calibration.from_timings(timings, 1, [LinkShape.symmetric(1.0)])
    unshaped = Calibration.from_timings(timings, 1)
    assert unshaped.overhead_s - shaped.overhead_s == pytest.approx(1.1)


def test_fleet_file_loads_as_a_fleet(tmp_path: Path) -> None:
    calibration = Calibration(0.004, 0.003, 0.5, 17.5, tasks=9)
    shapes = [LinkShape.symmetric(1), LinkShape(uplink_mbit=5, downlink_mbit=10)]
    text = calibration.fleet_toml("f", shapes, overhead=True, source="a test")
    spec = FleetSpec.from_mapping(tomllib.loads(text))
    first, second = spec.profiles
    assert first.latency == pytest.approx(18.0) and first.seconds_per_sample == 0.003
    assert (second.uplink_bps, second.downlink_bps) == (5e6, 10e6)
    naive = FleetSpec.from_mapping(
        tomllib.loads(calibration.fleet_toml("f", shapes, overhead=False, source="a test"))
    )
    assert naive.profiles[0].latency == 0.0 and naive.profiles[0].seconds_per_sample == 0.004


def test_nothing_to_calibrate() -> None:
    with pytest.raises(ValueError, match="calibrate"):
        Calibration.from_timings([_task(0, 0, 1.0, 2.0)], epochs=1)
