"""The fidelity experiment's setup and calibration (no process starts)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedsync.clock import FleetSpec
from fedsync.codecs import UpdateCodec
from fedsync.config import RunConfig
from fedsync.deploy.netns import LinkShape
from fedsync.deploy.timing import TaskTiming
from fedsync.recipe import model_for, model_state
from fedsync.simulations.fidelity import DEFAULT_SCENARIO, main
from fedsync.simulations.fidelity_setup import Calibration, FidelitySetup
from fedsync.simulations.scenario import (
    ScenarioError,
    app_run_config_defaults,
    load_scenario,
    parse_scenario,
)


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
    setup = FidelitySetup.from_scenario(load_scenario(DEFAULT_SCENARIO))
    assert setup.name == "links-fidelity"
    # The teasq table merged over the shared run config, as the scenario file has it.
    assert setup.run_config == {
        "dataset": "digits",
        "partitioning": "dirichlet",
        "dirichlet-alpha": 0.5,
        "fleet": "links-fidelity",
        "seed": 0,
        "plots": False,
        "local-epochs": 2,
        "strategy": "teasq",
        "concurrency": 3,
        "buffer-size": 2,
        "max-aggregations": 8,
        "eval-every": 1,
    }
    assert setup.federation == {"num-supernodes": 3, "client-resources-num-cpus": 1}
    assert setup.shapes == [LinkShape.symmetric(r) for r in (1.0, 5.0, 20.0)]
    assert (setup.target, setup.timeout, setup.epochs) == (0.7, 600.0, 2)


def test_the_dense_scenario_moves_over_a_megabyte_each_way_on_slow_links() -> None:
    setup = FidelitySetup.from_scenario(load_scenario("links-fidelity-dense"))
    assert setup.shapes == [LinkShape.symmetric(r) for r in (1.0, 2.0, 5.0)]
    assert setup.run_config["downlink-kind"] == "full"
    # The real encoded payloads of the scenario's model: its whole float32 state, both
    # ways, over 1 MB (8 s at 1 Mbit/s, 1.6 s at 5 Mbit/s).
    training = RunConfig.from_run_config(setup.run_config).training
    state = model_state(model_for(training))
    for key in ("uplink-codec", "downlink-codec"):
        payload = UpdateCodec(setup.run_config[key], seed=0).encode(state)
        assert len(payload) >= 1_000_000, key
    # Every fleet value besides the link rates is the compute speed; no latency.
    assert {p.latency for p in setup.fleet.profiles} == {0.0}


def test_command_line_refuses_a_poll_for_stock_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--scenario", "links-fidelity-dense", "--supernode-poll", "0.2"])
    assert exit_info.value.code == 2
    assert "--supernode-poll needs --nodes warm" in capsys.readouterr().err


def _scenario(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "tiny-links",
        "run-config": {"dataset": "digits", "fleet": "links-fidelity"},
        "federation": {"num-supernodes": 3},
        "target": {"accuracy": 0.6},
        "strategies": {"teasq": {"strategy": "teasq"}},
        "baseline": "teasq",
    }
    data.update(changes)
    return data


def test_setup_defaults_come_from_the_scenario_and_the_app() -> None:
    setup = FidelitySetup.from_scenario(parse_scenario(_scenario()))
    # The app's default local-epochs (0: the dataset's) as the typed config reads it.
    defaults = RunConfig.from_run_config(app_run_config_defaults())
    assert setup.epochs == defaults.training.local_epochs == 3
    assert setup.timeout == 900.0 and setup.target == 0.6


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target": {"fraction-of-best": 0.9}}, "absolute"),
        ({"federation": {"num-supernodes": 2}}, "2 supernodes but fleet links-fidelity has 3"),
        (
            {"strategies": {"fedasync": {"strategy": "fedasync"}}, "baseline": "fedasync"},
            "no strategy 'teasq'",
        ),
    ],
)
def test_setup_rejects_what_the_experiment_cannot_run(
    changes: dict[str, object], message: str
) -> None:
    scenario = parse_scenario(_scenario(**changes))
    with pytest.raises(ScenarioError, match=message):
        FidelitySetup.from_scenario(scenario)


def test_command_line_names_a_bad_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    # Bad input ends with a message and status 2 before anything is built or started.
    assert main(["--scenario", "no-such-scenario"]) == 2
    assert "scenario 'no-such-scenario' not found" in capsys.readouterr().err


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
