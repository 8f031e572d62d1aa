"""The numbers an asynchronous run reports: bytes, staleness, drops, errors, accuracy.

:class:`RunTally` is filled by the loop as things happen and turned into the
``summary.json`` fields at the end. Bytes are the lengths of real payloads, counted
when they cross the (simulated) link: downlink at dispatch, uplink at arrival.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fedsync.aggregation.health import TrainingHealth

__all__ = ["RunTally", "TargetReached"]

_LOG = logging.getLogger("flwr")
"""Flower's logger by name (its handlers, when the process runs Flower), without
importing Flower: the engine stays free of it."""


@dataclass(frozen=True)
class TargetReached:
    """When the global model first reached the target accuracy."""

    accuracy: float
    version: int
    sim_time: float
    wall_time: float
    bytes_up: int
    bytes_down: int
    bytes_down_broadcast: int | None = None


@dataclass
class RunTally:
    """Running totals of one asynchronous run.

    Parameters
    ----------
    target_accuracy : float
        Accuracy whose time and bytes to reach are recorded (``0``: none).
    """

    target_accuracy: float = 0.0
    # --- traffic ---
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_down_broadcast: int | None = None
    """A shared downlink's bytes if each change were broadcast once (``None``: not such
    a run; then the figure is left out of the reports)."""
    tasks: int = 0
    arrivals: int = 0
    aggregated: int = 0
    # --- what went wrong ---
    staleness: Counter[int] = field(default_factory=Counter)
    drops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    gave_up: list[int] = field(default_factory=list)
    # --- accuracy over time ---
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    target: TargetReached | None = None
    health: TrainingHealth = field(default_factory=TrainingHealth)

    def record_evaluation(
        self, version: int, metrics: dict[str, float], *, sim_time: float, wall_time: float
    ) -> dict[str, Any]:
        """Store one central evaluation, check the target and the run's health (a new
        problem is logged as a warning and noted in the entry as ``health_warning``);
        returns the entry."""
        accuracy = float(metrics.get("accuracy", float("nan")))
        entry: dict[str, Any] = {
            "version": version,
            "accuracy": accuracy,
            "loss": float(metrics.get("loss", float("nan"))),
            "sim_time": round(sim_time, 6),
            "cumulative_bytes_up": self.bytes_up,
            "cumulative_bytes_down": self.bytes_down,
        }
        if self.bytes_down_broadcast is not None:
            entry["cumulative_bytes_down_broadcast"] = self.bytes_down_broadcast
        entry.update({k: float(v) for k, v in metrics.items() if k not in entry and _is_number(v)})
        unmeasured = [name for name in ("accuracy", "loss") if name not in metrics]
        if unmeasured:  # an application's evaluate_fn that reports only some of them
            entry["unmeasured"] = unmeasured
        self.evaluations.append(entry)
        if self.target is None and self.target_accuracy > 0.0 and accuracy >= self.target_accuracy:
            self.target = TargetReached(
                accuracy,
                version,
                sim_time,
                wall_time,
                self.bytes_up,
                self.bytes_down,
                self.bytes_down_broadcast,
            )
        verdict = self.health.observe(self.evaluations)
        if verdict is not None:
            entry["health_warning"] = verdict.message
            _LOG.warning("[fedsync] %s: %s", verdict.status, verdict.message)
        return entry

    def summary(self) -> dict[str, Any]:
        """The tally as ``summary.json`` fields."""
        accuracies = [e["accuracy"] for e in self.evaluations]
        total_stale = sum(self.staleness.values())
        target: dict[str, Any] = {"accuracy": self.target_accuracy or None, "reached": False}
        if self.target is not None:
            target.update(
                reached=True,
                version=self.target.version,
                sim_time=round(self.target.sim_time, 6),
                wall_time=round(self.target.wall_time, 3),
                bytes_up=self.target.bytes_up,
                bytes_down=self.target.bytes_down,
            )
            if self.target.bytes_down_broadcast is not None:
                target["bytes_down_broadcast"] = self.target.bytes_down_broadcast
        return {
            "final_accuracy": accuracies[-1] if accuracies else None,
            "best_accuracy": max(accuracies) if accuracies else None,
            "final_loss": self.evaluations[-1]["loss"] if self.evaluations else None,
            "total_bytes_up": self.bytes_up,
            "total_bytes_down": self.bytes_down,
            **(
                {"total_bytes_down_broadcast": self.bytes_down_broadcast}
                if self.bytes_down_broadcast is not None
                else {}
            ),
            "tasks": self.tasks,
            "arrivals": self.arrivals,
            "aggregated_updates": self.aggregated,
            "target": target,
            "health": self.health.summary(self.evaluations),
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "mean_staleness": (
                sum(k * v for k, v in self.staleness.items()) / total_stale if total_stale else None
            ),
            "drops": dict(sorted(self.drops.items())),
            "drops_total": sum(self.drops.values()),
            "errors": dict(sorted(self.errors.items())),
            "errors_total": sum(self.errors.values()),
            "devices_given_up": sorted(self.gave_up),
        }


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
