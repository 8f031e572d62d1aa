"""Progress bars for long runs, fed by the runs' own ``events.jsonl`` as it grows.

A run of the app writes one JSON line per event (``train_round`` for FedAvg,
``aggregation`` for the asynchronous strategies, ``evaluation`` with the accuracy and
the simulated time). :class:`EventTail` reads the lines appended since its last call;
:class:`ComparisonProgress` shows one bar per strategy and one overall, with the current
accuracy and simulated time. Bars are drawn only for a person at a terminal: when
stdout is not a TTY or ``CI`` is set, :func:`interactive` is false and nothing is drawn
(CI logs keep their plain lines).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from fedsync.config import RunConfig
from fedsync.reports.progress_bar import interactive

__all__ = ["ComparisonProgress", "EventTail", "RunState", "budget_of", "interactive"]


def budget_of(run_config: Mapping[str, Any]) -> int:
    """Rounds (FedAvg) or aggregations (an engine strategy) a run is set to do."""
    config = RunConfig.from_run_config(run_config)
    return config.stop.max_aggregations if config.runs_on_engine else config.fedavg.num_rounds


class EventTail:
    """Reads the complete lines appended to an ``events.jsonl`` since the last call.

    Parameters
    ----------
    path : pathlib.Path
        The event log; it need not exist yet.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        """The events written since the previous call (a partial last line waits)."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offset += end + 1
        events = []
        for line in chunk[: end + 1].splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


@dataclass
class RunState:
    """What the events of one run said so far."""

    done: int = 0
    accuracy: float | None = None
    sim_time: float | None = None
    warning: str | None = None

    def update(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Fold new events in: rounds/aggregations done, the latest evaluation."""
        for event in events:
            kind = event.get("event")
            if kind == "train_round" and isinstance(event.get("round"), int):
                self.done = max(self.done, int(event["round"]))
            elif kind == "aggregation" and isinstance(event.get("version"), int):
                self.done = max(self.done, int(event["version"]))
            elif kind == "evaluation" and isinstance(event.get("accuracy"), int | float):
                self.accuracy = float(event["accuracy"])
                sim_time = event.get("sim_time")
                self.sim_time = float(sim_time) if isinstance(sim_time, int | float) else None
                if isinstance(event.get("health_warning"), str):
                    self.warning = str(event["health_warning"])

    def describe(self) -> str:
        """``acc 0.9417  sim 31.2 s`` (blank parts while unknown), and the run's health
        warning once there is one."""
        parts = []
        if self.accuracy is not None:
            parts.append(f"acc {self.accuracy:.4f}")
        if self.sim_time is not None:
            parts.append(f"sim {self.sim_time:.1f} s")
        if self.warning:
            parts.append(f"WARNING {self.warning}")
        return "  ".join(parts)


class ComparisonProgress:
    """One bar per strategy and one overall, polling each run's event log.

    Use as a context manager around the runs; call :meth:`watch` when a run starts
    and :meth:`finish` when it ends. Draws nothing unless ``enabled``.

    Parameters
    ----------
    budgets : mapping
        Label -> rounds or aggregations of that run (:func:`budget_of`).
    enabled : bool
        Draw the bars (default: :func:`interactive`).
    poll_seconds : float
        How often the watched log is read.
    """

    def __init__(
        self,
        budgets: Mapping[str, int],
        *,
        enabled: bool | None = None,
        poll_seconds: float = 0.5,
    ) -> None:
        self.budgets = dict(budgets)
        self.enabled = interactive() if enabled is None else enabled
        self.poll_seconds = poll_seconds
        self.states = {label: RunState() for label in self.budgets}
        self._progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not self.enabled,
        )
        self._overall = self._progress.add_task(
            "overall", total=sum(self.budgets.values()), status=""
        )
        self._tasks: dict[str, TaskID] = {
            label: self._progress.add_task(label, total=total, status="waiting")
            for label, total in self.budgets.items()
        }
        self._lock = threading.Lock()
        self._watched: tuple[str, EventTail] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="progress", daemon=True)

    def __enter__(self) -> ComparisonProgress:
        if self.enabled:
            self._progress.start()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._progress.stop()

    def watch(self, label: str, events: Path) -> None:
        """Follow ``events`` as the log of the run ``label`` (now starting)."""
        with self._lock:
            self._watched = (label, EventTail(events))
            self._progress.update(self._tasks[label], status="starting")

    def finish(self, label: str, status: str) -> None:
        """Read the run's last events and mark it ended with ``status``."""
        with self._lock:
            self._refresh()
            self._watched = None
            state = self.states[label]
            self._progress.update(
                self._tasks[label], status=f"{status}  {state.describe()}".strip()
            )

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            with self._lock:
                self._refresh()

    def _refresh(self) -> None:
        if self._watched is None:
            return
        label, tail = self._watched
        state = self.states[label]
        state.update(tail.read())
        self._progress.update(
            self._tasks[label],
            completed=min(state.done, self.budgets[label]),
            status=state.describe() or "starting",
        )
        overall = sum(min(s.done, self.budgets[k]) for k, s in self.states.items())
        self._progress.update(self._overall, completed=overall)
