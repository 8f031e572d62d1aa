"""One result type for every strategy: what ``summary.json`` holds.

Flower's FedAvg and fedsync's asynchronous strategies end the same way: a
:class:`RunSummary` built from the run's :class:`~fedsync.aggregation.tally.RunTally`
(bytes, accuracy over time, the target), written as ``summary.json`` with the same keys
for every strategy, and read back by the comparison runner with :meth:`RunSummary.read`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsync.aggregation.tally import RunTally

__all__ = ["RunFailedError", "RunSummary"]


class RunFailedError(RuntimeError):
    """A run that ended without training: every device was given up (its
    ``summary.json`` is written and names the errors, as this message does)."""


@dataclass
class RunSummary:
    """How one run went.

    Attributes
    ----------
    strategy : str
        The ``strategy`` run-config value.
    stop_reason : str
        Why it ended (``num-rounds`` for FedAvg; ``max-aggregations``,
        ``target-accuracy``, ``max-sim-time``, ... for the asynchronous strategies).
    aggregations : int
        Global model updates: FedAvg's rounds, or the asynchronous aggregations.
    sim_time : float
        Clock time at the end (simulated seconds on the virtual clock).
    wall_time : float
        Real seconds the strategy ran.
    tally : RunTally
        Bytes, tasks, staleness, drops, errors and every central evaluation.
    fleet : str
        The fleet the clock timed the run on.
    config : dict
        The run config the strategy ran with.
    details : dict
        What only some strategies have (the policy, the server optimizer, per-device
        counters, checkpoints, the clock, ...).
    """

    strategy: str
    stop_reason: str
    aggregations: int
    sim_time: float
    wall_time: float
    tally: RunTally
    fleet: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` document (the same keys for every strategy)."""
        return {
            "strategy": self.strategy,
            "stop_reason": self.stop_reason,
            "aggregations": self.aggregations,
            "sim_time": round(self.sim_time, 6),
            "wall_time": round(self.wall_time, 3),
            **self.tally.summary(),
            "fleet": self.fleet,
            **self.details,
            "config": self.config,
            "evaluations": self.tally.evaluations,
        }

    @staticmethod
    def read(path: Path) -> dict[str, Any]:
        """A ``summary.json`` as written by :meth:`to_dict` (``{}`` if unreadable)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def evaluations(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The evaluation entries of a summary document."""
        return list(summary.get("evaluations") or [])
