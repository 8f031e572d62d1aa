"""Scenario files: loading, validation, target rules, scaling (fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedsync.simulations.compare import ComparisonRunner
from fedsync.simulations.scenario import (
    PROJECT_ROOT,
    SCENARIO_DIR,
    ScenarioError,
    TargetRule,
    load_scenario,
    parse_scenario,
)


def _scenario_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "toy",
        "run-config": {"dataset": "digits", "fleet": "digits-stragglers"},
        "federation": {"num-supernodes": 4, "client-resources-num-cpus": 1},
        "target": {"fraction-of-best": 0.9},
        "strategies": {
            "fedavg": {"strategy": "fedavg", "num-rounds": 3},
            "teasq": {"strategy": "teasq", "concurrency": 2, "density-start": 0.1},
        },
    }
    data.update(changes)
    return data


# --- parsing --------------------------------------------------------------------------------
def test_every_shipped_scenario_loads() -> None:
    names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    assert {"digits-stragglers", "fmnist-teasq", "fmnist-teasq-alpha01", "fmnist-ci"} <= set(names)
    for name in names:
        scenario = load_scenario(name)
        assert scenario.baseline in scenario.labels
        strategies = {s.strategy for s in scenario.strategies}
        # Comparisons pit TEASQ mode against FedAvg, or (cross-site) asynchronous sites
        # against synchronous DiLoCo; an ablation varies one strategy alone
        # (fmnist-teasq-ablations, fmnist-downlink: TEASQ mode; fmnist-pruned: FedBuff).
        assert (
            {"fedavg", "teasq"} <= strategies
            or len(strategies) == 1
            or ("diloco" in strategies and len(strategies) > 1)
        ), name


def test_overrides_merge_over_shared_keys() -> None:
    data = _scenario_data()
    data["run-config"]["seed"] = 1
    data["strategies"]["teasq"]["seed"] = 7
    scenario = parse_scenario(data)
    teasq = scenario.strategy("teasq")
    assert teasq.strategy == "teasq"
    assert teasq.run_config["dataset"] == "digits"
    assert teasq.run_config["seed"] == 7  # the strategy's value wins over the shared one
    assert scenario.strategy("fedavg").run_config["seed"] == 1
    assert scenario.run_config["seed"] == 1
    assert teasq.run_config["concurrency"] == 2
    assert "concurrency" not in scenario.strategy("fedavg").run_config
    assert scenario.federation == {"num-supernodes": 4, "client-resources-num-cpus": 1}


def test_a_strategy_may_run_on_a_federation_of_its_own() -> None:
    data = _scenario_data()
    data["strategies"]["teasq"]["federation"] = {"num-supernodes": 1}
    scenario = parse_scenario(data)
    assert scenario.federation_of("teasq") == {"num-supernodes": 1, "client-resources-num-cpus": 1}
    assert scenario.federation_of("fedavg") == scenario.federation
    assert "federation" not in scenario.strategy("teasq").run_config
    # Scaling and seeding keep it.
    assert scenario.scaled(0.5).federation_of("teasq")["num-supernodes"] == 1
    assert scenario.seeded(3).federation_of("teasq")["num-supernodes"] == 1
    data["strategies"]["teasq"]["federation"] = {"num-supernodes": 0}
    with pytest.raises(ScenarioError, match=r"\[strategies.teasq\] \[federation\]"):
        parse_scenario(data)


def test_int_accepted_where_the_default_is_a_float() -> None:
    data = _scenario_data()
    data["strategies"]["teasq"]["density-start"] = 1
    value = parse_scenario(data).strategy("teasq").run_config["density-start"]
    assert value == 1.0 and isinstance(value, float)


def test_relative_data_dir_is_resolved_against_the_project() -> None:
    data = _scenario_data()
    data["run-config"]["data-dir"] = "../shared/data"
    scenario = parse_scenario(data)
    assert scenario.run_config["data-dir"] == str((PROJECT_ROOT / "../shared/data").resolve())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["run-config"].update({"num-round": 3}), "'num-round' is not a run-config"),
        (lambda d: d["run-config"].update({"results-dir": "x"}), "'results-dir' is set by"),
        (
            lambda d: d["strategies"]["teasq"].update({"concurrency": 2.5}),
            r"\[strategies.teasq\]: 'concurrency' must be int",
        ),
        (lambda d: d["strategies"]["fedavg"].pop("strategy"), "must set 'strategy'"),
        (
            lambda d: d["strategies"]["teasq"].update({"strategy": "fedsgd"}),
            "'strategy' must be",
        ),
        (
            lambda d: d["strategies"]["teasq"].update({"buffer-size": 0}),
            r"\[strategies.teasq\].*buffer-size",
        ),
        (lambda d: d["run-config"].update({"fleet": "no-such-fleet"}), "no-such-fleet"),
        (lambda d: d.update({"target": {}}), "exactly one of"),
        (lambda d: d.update({"target": {"accuracy": 0.9, "fraction-of-best": 0.9}}), "exactly"),
        (lambda d: d.update({"target": {"fraction-of-best": 1.5}}), r"in \(0, 1\]"),
        (lambda d: d.pop("target"), r"needs a \[target\]"),
        (lambda d: d.update({"federation": {"num-nodes": 3}}), "unknown key 'num-nodes'"),
        (lambda d: d.update({"strategies": {}}), r"at least one \[strategies"),
        (lambda d: d.update({"strategies": {"Bad Label": {}}}), "label must match"),
        (lambda d: d.update({"timeout": -1}), "'timeout'"),
        (lambda d: d.update({"baseline": "fedav"}), "'baseline' must be one of"),
        (lambda d: d.update({"runconfig": {}}), "unknown top-level keys"),
    ],
)
def test_errors_name_the_key(mutate: Any, message: str) -> None:
    data = _scenario_data()
    mutate(data)
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data)


def test_unknown_scenario_lists_the_known_ones() -> None:
    with pytest.raises(ScenarioError, match="digits-stragglers"):
        load_scenario("no-such-scenario")


def test_bad_toml_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("name = \n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(path)


def test_only_keeps_file_order_and_refuses_unknown_labels() -> None:
    scenario = parse_scenario(_scenario_data())
    assert scenario.only(["teasq", "fedavg"]).labels == ["fedavg", "teasq"]
    assert scenario.only(["teasq"]).labels == ["teasq"]
    with pytest.raises(ScenarioError, match="fedbuff"):
        scenario.only(["fedbuff"])


# --- targets and scaling --------------------------------------------------------------------
def test_target_rules() -> None:
    assert TargetRule("accuracy", 0.8).resolve([0.1]) == 0.8
    assert TargetRule("fraction-of-best", 0.5).resolve([0.6, None, 0.9]) == pytest.approx(0.45)
    assert TargetRule("fraction-of-best", 0.5).resolve([None]) is None


def test_scaled_shortens_each_strategy_by_its_own_length_keys() -> None:
    scenario = parse_scenario(_scenario_data())
    half = scenario.scaled(0.5)
    assert half.scale == 0.5
    assert half.strategy("fedavg").run_config["num-rounds"] == 2  # round(3 * 0.5)
    assert "max-aggregations" not in half.strategy("fedavg").run_config
    # teasq did not set max-aggregations: the app's default (pyproject) is scaled.
    assert half.strategy("teasq").run_config["max-aggregations"] == 25
    assert "num-rounds" not in half.strategy("teasq").run_config
    assert "max-tasks" not in half.strategy("teasq").run_config  # 0 means no cap: kept
    assert scenario.scaled(0.01).strategy("fedavg").run_config["num-rounds"] == 1
    assert scenario.scaled(1.0) is scenario
    with pytest.raises(ScenarioError, match="scale"):
        scenario.scaled(0.0)


def test_seeded_sets_every_strategys_seed() -> None:
    scenario = parse_scenario(_scenario_data())
    assert scenario.seed == 0  # none set: the app's default
    seeded = scenario.seeded(3)
    assert seeded.seed == 3 and seeded.run_config["seed"] == 3
    assert [spec.run_config["seed"] for spec in seeded.strategies] == [3, 3]
    assert seeded.strategy("teasq").run_config["density-start"] == 0.1  # the rest kept
    apart = parse_scenario(
        _scenario_data(
            strategies={
                "fedavg": {"strategy": "fedavg", "seed": 1},
                "teasq": {"strategy": "teasq", "seed": 2},
            }
        )
    )
    assert apart.seed is None and apart.seeded(4).seed == 4
    for bad in (-1, True, 1.5):
        with pytest.raises(ScenarioError, match="seed"):
            scenario.seeded(bad)  # type: ignore[arg-type]


def test_runner_refuses_a_run_folder_that_already_holds_results(tmp_path: Path) -> None:
    (tmp_path / "results" / "teasq").mkdir(parents=True)
    runner = ComparisonRunner(parse_scenario(_scenario_data()), tmp_path)
    with pytest.raises(FileExistsError, match="teasq"):
        runner.run()  # before any SuperLink starts
    assert runner.started_pids == []
