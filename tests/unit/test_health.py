"""The run's health check: divergence and no-learning verdicts on central evaluations."""

from __future__ import annotations

import math
from typing import Any

from fedsync.aggregation.health import TrainingHealth, health_problem
from fedsync.aggregation.tally import RunTally

CHANCE = {"chance_accuracy": 0.1135, "chance_loss": math.log(10), "num_examples": 10000.0}


def history(*points: tuple[float, float], every: int = 5) -> list[dict[str, Any]]:
    """Evaluations at v0, v5, ... from (accuracy, loss) pairs."""
    return [
        {"version": i * every, "accuracy": acc, "loss": loss, **CHANCE}
        for i, (acc, loss) in enumerate(points)
    ]


def test_a_learning_run_is_ok() -> None:
    evaluations = history((0.1, 2.30), (0.6, 1.2), (0.8, 0.6), (0.9, 0.35), (0.93, 0.25))
    assert TrainingHealth.check(evaluations) is None


def test_overfitting_is_not_divergence() -> None:
    # The test loss rises from its best, but stays far below the initial model's.
    evaluations = history((0.1, 2.30), (0.9, 0.30), (0.92, 0.45), (0.92, 0.70), (0.91, 0.95))
    assert TrainingHealth.check(evaluations) is None


def test_the_issue_run_diverged() -> None:
    # MNIST at learning rate 0.1, momentum 0.9, 3 epochs: chance accuracy, loss 2.3 -> 9.1.
    evaluations = history((0.098, 2.30), (0.101, 3.9), (0.089, 6.2), (0.11, 9.1))
    verdict = TrainingHealth.check(evaluations)
    assert verdict is not None and verdict.status == "diverged"
    assert "test loss rose from 2.3 to 9.1 over 15 aggregations" in verdict.message
    assert "learning-rate" in verdict.message and verdict.version == 15


def test_one_spike_is_not_divergence() -> None:
    evaluations = history((0.1, 2.3), (0.7, 0.9), (0.5, 4.0), (0.8, 0.7))
    assert TrainingHealth.check(evaluations) is None


def test_a_non_finite_loss_diverged_at_once() -> None:
    verdict = TrainingHealth.check(history((0.1, 2.3), (0.098, math.nan)))
    assert verdict is not None and verdict.status == "diverged"
    assert "nan at v5" in verdict.message


def test_accuracy_at_chance_is_stuck_after_three_evaluations() -> None:
    at_chance = [(0.1, 2.30), (0.105, 2.29), (0.11, 2.29)]
    assert TrainingHealth.check(history(*at_chance)) is None  # two trained evaluations
    verdict = TrainingHealth.check(history(*at_chance, (0.113, 2.28)))
    assert verdict is not None and verdict.status == "stuck"
    assert "always answering the most frequent class scores 0.114" in verdict.message
    # Just above chance plus the margin counts as learning.
    assert TrainingHealth.check(history(*at_chance, (0.16, 2.2))) is None


def test_a_small_test_set_widens_the_margin() -> None:
    # 360 examples (digits): two standard errors of the chance rate are 0.032, not 0.02.
    points = history((0.1, 2.3), (0.125, 2.2), (0.125, 2.2), (0.125, 2.2))
    for point in points:
        point.update(chance_accuracy=0.1, num_examples=360.0)
    verdict = TrainingHealth.check(points)
    assert verdict is not None and verdict.status == "stuck"


def test_without_references_only_the_loss_is_judged() -> None:
    # A user's evaluation function may give no chance values: no stuck verdict, and the
    # rise is judged against the first evaluation alone.
    plain = [{"version": i, "accuracy": 0.1, "loss": loss} for i, loss in enumerate([2, 2, 2, 2])]
    assert TrainingHealth.check(plain) is None
    rising = [{"version": i, "accuracy": 0.1, "loss": x} for i, x in enumerate([2, 2.5, 3.1, 3.2])]
    verdict = TrainingHealth.check(rising)
    assert verdict is not None and verdict.status == "diverged"


def test_warnings_come_once_and_a_recovery_ends_ok() -> None:
    health = TrainingHealth()
    points = history((0.1, 2.3), (0.1, 2.3), (0.1, 2.3), (0.11, 2.3), (0.1, 2.3), (0.5, 1.5))
    new = [health.observe(points[: i + 1]) for i in range(len(points))]
    assert [v.status if v else None for v in new] == [None, None, None, "stuck", None, None]
    summary = health.summary(points)
    assert summary["status"] == "ok" and summary["message"] is None
    assert [w["status"] for w in summary["warnings"]] == ["stuck"]
    assert health_problem({"health": summary}) is None


def test_the_tally_reports_health_in_the_summary() -> None:
    tally = RunTally()
    entries = [
        tally.record_evaluation(
            v, {"accuracy": acc, "loss": loss, **CHANCE}, sim_time=v, wall_time=v
        )
        for v, acc, loss in [(0, 0.1, 2.3), (5, 0.1, 4.0), (10, 0.1, 7.0)]
    ]
    assert "health_warning" not in entries[1]
    assert entries[2]["health_warning"].startswith("test loss rose from 2.3 to 7")
    summary = tally.summary()
    assert summary["health"]["status"] == "diverged"
    problem = health_problem(summary)
    assert problem is not None and problem.startswith("diverged: test loss rose")
    assert health_problem({}) is None  # an older summary.json without the field
