"""Scenario files, target accuracy from evaluation series, ratios vs the baseline (fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulations.compare import (
    ComparisonRunner,
    EvalPoint,
    RunResult,
    build_comparison,
    first_reaching,
    ratio,
    read_series,
    staleness_bins,
    write_reports,
)
from simulations.scenario import (
    PROJECT_ROOT,
    SCENARIO_DIR,
    Scenario,
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
        # Comparisons pit TEASQ mode against FedAvg; an ablation varies TEASQ mode alone.
        assert {"fedavg", "teasq"} <= strategies or (
            name.endswith("ablations") and strategies == {"teasq"}
        )


def test_overrides_merge_over_shared_keys() -> None:
    scenario = parse_scenario(_scenario_data())
    teasq = scenario.strategy("teasq")
    assert teasq.strategy == "teasq"
    assert teasq.run_config["dataset"] == "digits"
    assert teasq.run_config["concurrency"] == 2
    assert "concurrency" not in scenario.strategy("fedavg").run_config
    assert scenario.federation == {"num-supernodes": 4, "client-resources-num-cpus": 1}


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


# --- targets and ratios ---------------------------------------------------------------------
def test_target_rules() -> None:
    assert TargetRule("accuracy", 0.8).resolve([0.1]) == 0.8
    assert TargetRule("fraction-of-best", 0.5).resolve([0.6, None, 0.9]) == pytest.approx(0.45)
    assert TargetRule("fraction-of-best", 0.5).resolve([None]) is None


def _series(*points: tuple[float, int, float]) -> list[EvalPoint]:
    return [EvalPoint(t, up, 2 * up, acc) for t, up, acc in points]


def test_first_reaching_takes_the_first_crossing_not_the_last() -> None:
    series = _series((0.0, 0, 0.1), (5.0, 10, 0.82), (6.0, 12, 0.7), (9.0, 20, 0.9))
    hit = first_reaching(series, 0.8)
    assert hit == EvalPoint(5.0, 10, 20, 0.82)
    assert first_reaching(series, 0.95) is None
    assert first_reaching(series, None) is None


def test_ratio() -> None:
    assert ratio(2.0, 8.0) == 0.25
    assert ratio(None, 8.0) is None
    assert ratio(2.0, None) is None
    assert ratio(2.0, 0.0) is None


def test_read_series_from_either_summary_shape(tmp_path: Path) -> None:
    entry = {"sim_time": 3.0, "cumulative_bytes_up": 7, "cumulative_bytes_down": 9, "accuracy": 0.5}
    assert read_series({"rounds": [entry]}) == [EvalPoint(3.0, 7, 9, 0.5)]
    assert read_series({"evaluations": [entry]}) == [EvalPoint(3.0, 7, 9, 0.5)]
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "evaluation", "sim_time": 1.0, "accuracy": 0.2}\n')
    assert read_series({}, events) == [EvalPoint(1.0, 0, 0, 0.2)]


def _result(label: str, strategy: str, series: list[EvalPoint], status: str = "") -> RunResult:
    summary = {"final_accuracy": series[-1].accuracy, "best_accuracy": 1.0} if series else {}
    return RunResult(
        label, strategy, status or "finished:completed", 10.0, summary=summary, series=series
    )


def _toy() -> Scenario:
    return parse_scenario(_scenario_data())


def test_comparison_fixes_the_target_after_all_runs_and_computes_ratios(tmp_path: Path) -> None:
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.8), (20, 2000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (2, 50, 0.85), (4, 100, 1.0)))
    comparison = build_comparison(_toy(), [fedavg, teasq])
    # 0.9 x the best final accuracy (teasq's 1.0), though fedavg's run never saw it.
    assert comparison.target == pytest.approx(0.9)
    assert comparison.all_completed
    base, fast = comparison.row("fedavg"), comparison.row("teasq")
    assert base["target"]["sim_time"] == 20 and base["target"]["bytes_up"] == 2000
    assert fast["target"]["sim_time"] == 4 and fast["target"]["bytes_down"] == 200
    assert fast["ratios_vs_baseline"]["time_to_target"] == pytest.approx(0.2)
    assert fast["ratios_vs_baseline"]["uplink_bytes_to_target"] == pytest.approx(0.05)
    assert base["ratios_vs_baseline"]["time_to_target"] == 1.0

    paths = write_reports(comparison, tmp_path)
    assert [p.name for p in paths] == ["comparison.json", "comparison.md", "comparison.png"]
    assert "| teasq | ok |" in (tmp_path / "comparison.md").read_text()


def test_staleness_is_binned_and_reported_for_asynchronous_runs(tmp_path: Path) -> None:
    assert staleness_bins({"0": 3, "1": 1, "4": 2, "7": 1, "40": 5}) == [3, 1, 0, 2, 1, 0, 0, 5]
    assert staleness_bins({}) == [0] * 8
    fedavg = _result("fedavg", "fedavg", _series((0, 0, 0.1), (10, 1000, 0.9)))
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (4, 100, 1.0)))
    teasq.summary.update(staleness_histogram={"0": 1, "1": 2, "3": 1}, mean_staleness=1.25)
    comparison = build_comparison(_toy(), [fedavg, teasq])
    paths = write_reports(comparison, tmp_path)
    assert [p.name for p in paths][-1] == "staleness.png"
    table = (tmp_path / "comparison.md").read_text()
    assert "| teasq | 4 | 1.25 | 25 % | 50 % | 0 % | 25 % | 0 % |" in table
    assert "| fedavg | " not in table.split("Staleness")[1]  # synchronous: no row


def test_a_failed_or_missing_run_gives_no_ratio_and_no_completion() -> None:
    fedavg = _result("fedavg", "fedavg", [], status="finished:failed")
    teasq = _result("teasq", "teasq", _series((0, 0, 0.1), (4, 100, 0.9)))
    comparison = build_comparison(_toy(), [fedavg, teasq])
    assert not comparison.all_completed
    assert comparison.target == pytest.approx(0.81)  # from the completed run only
    row = comparison.row("teasq")
    assert row["target"]["reached"]
    assert row["ratios_vs_baseline"]["time_to_target"] is None
    assert comparison.row("fedavg")["target"]["reached"] is False


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


def test_runner_refuses_a_run_folder_that_already_holds_results(tmp_path: Path) -> None:
    (tmp_path / "results" / "teasq").mkdir(parents=True)
    runner = ComparisonRunner(parse_scenario(_scenario_data()), tmp_path)
    with pytest.raises(FileExistsError, match="teasq"):
        runner.run()  # before any SuperLink starts
    assert runner.started_pids == []
