"""A comparison against a target test loss (the cross-site scenario's): the rule, the
first crossing, total bytes, and the loss table and figure (fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsync.simulations.report import write_reports
from fedsync.simulations.results import EvalPoint, RunResult, build_comparison, first_reaching_loss
from fedsync.simulations.scenario import Scenario, ScenarioError, TargetRule, parse_scenario


def _points(*points: tuple[float, int, float]) -> list[EvalPoint]:
    """``(sim_time, bytes_up, loss)``; the downlink moves twice the uplink."""
    return [EvalPoint(t, up, 2 * up, 0.5, loss) for t, up, loss in points]


def _result(label: str, strategy: str, series: list[EvalPoint]) -> RunResult:
    summary = {"final_accuracy": 0.5, "final_loss": series[-1].loss, "best_accuracy": 0.5}
    return RunResult(label, strategy, "finished:completed", 10.0, summary=summary, series=series)


def _scenario(value: float = 1.02) -> Scenario:
    return parse_scenario(
        {
            "name": "toy-loss",
            "run-config": {"dataset": "digits", "fleet": "digits-stragglers"},
            "federation": {"num-supernodes": 4},
            "target": {"loss-of-baseline": value},
            "baseline": "dense",
            "strategies": {
                "dense": {"strategy": "diloco", "concurrency": 4},
                "sparse": {"strategy": "fedbuff", "concurrency": 4},
            },
        }
    )


def test_the_rule_is_a_multiple_of_the_baselines_final_loss() -> None:
    rule = TargetRule("loss-of-baseline", 1.02)
    assert rule.is_loss and rule.metric == "loss"
    assert rule.resolve_loss(2.0) == pytest.approx(2.04)
    assert rule.resolve_loss(None) is None
    assert "1.02 x the baseline's final test loss" in rule.describe()
    with pytest.raises(ScenarioError, match="resolve_loss"):
        rule.resolve([0.5])
    with pytest.raises(ScenarioError, match="accuracy, not a loss"):
        TargetRule("accuracy", 0.9).resolve_loss(2.0)


@pytest.mark.parametrize("value", [0.98, 0.0, 11.0, float("nan")])
def test_a_loss_target_below_the_baseline_or_absurd_is_refused(value: float) -> None:
    with pytest.raises(ScenarioError, match=r"loss-of-baseline must be in \[1, 10\]"):
        _scenario(value)


def test_first_reaching_loss_takes_the_first_point_at_or_below() -> None:
    series = _points((0, 0, 4.0), (1, 10, 2.5), (2, 20, 2.0), (3, 30, 2.2))
    assert first_reaching_loss(series, 2.5) == series[1]
    assert first_reaching_loss(series, 1.9) is None
    assert first_reaching_loss(series, None) is None


def test_comparison_on_a_loss_target_with_total_byte_ratios(tmp_path: Path) -> None:
    dense = _result("dense", "diloco", _points((0, 0, 4.0), (10, 1000, 2.2), (20, 2000, 2.0)))
    sparse = _result("sparse", "fedbuff", _points((0, 0, 4.0), (4, 5, 2.1), (8, 10, 1.95)))
    comparison = build_comparison(_scenario(), [dense, sparse])
    assert comparison.metric == "loss"
    assert comparison.target == pytest.approx(2.04)  # 1.02 x dense's final 2.0
    base, fast = comparison.row("dense"), comparison.row("sparse")
    assert base["target"]["sim_time"] == 20 and base["target"]["bytes_total"] == 6000
    assert fast["target"]["sim_time"] == 8 and fast["target"]["bytes_total"] == 30
    assert fast["ratios_vs_baseline"]["total_bytes_to_target"] == pytest.approx(0.005)
    assert fast["ratios_vs_baseline"]["time_to_target"] == pytest.approx(0.4)
    assert fast["final_loss"] == 1.95 and fast["best_loss"] == 1.95
    document = comparison.as_dict()
    assert document["target_metric"] == "loss" and document["target_accuracy"] is None
    assert document["target_loss"] == pytest.approx(2.04)
    assert document["strategies"][1]["evaluations"][-1] == [8, 10, 20, 0.5, 1.95]

    names = [p.name for p in write_reports(comparison, tmp_path)]
    assert "loss.png" in names and (tmp_path / "loss.png").stat().st_size > 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| sparse | 1.9500 | 1.9500 | 0.5000 | 8.0 | 0.400 |" in table
    assert "| 0.0050 | 200.0 |" in table


def test_no_completed_baseline_no_loss_target() -> None:
    sparse = _result("sparse", "fedbuff", _points((0, 0, 4.0), (4, 5, 2.1)))
    comparison = build_comparison(_scenario(), [sparse])
    assert comparison.target is None
    assert comparison.row("sparse")["target"]["reached"] is False
