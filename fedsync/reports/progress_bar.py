"""Whether to draw progress bars, and the asynchronous loop's bar.

Bars are for a person at a terminal: :func:`interactive` is false when stdout is not a
TTY or ``CI`` is set, and then nothing is drawn (logs keep their plain lines). The
comparison runner's bars are :mod:`fedsync.simulations.progress`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.progress import track as rich_track

__all__ = ["LoopProgress", "interactive", "track"]


T = TypeVar("T")


def track(items: Iterable[T], description: str, *, total: int | None = None) -> Iterator[T]:
    """``items``, with a progress bar while a person watches (:func:`interactive`);
    the benchmarks' outer loops use it."""
    if not interactive():
        yield from items
        return
    yield from rich_track(items, description=description, total=total, transient=True)


def interactive() -> bool:
    """Whether to draw progress bars: stdout is a terminal and ``CI`` is not set."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
        return False
    return sys.stdout.isatty()


class LoopProgress:
    """One bar over an asynchronous run's aggregations, with the latest accuracy and
    simulated time; draws nothing unless ``enabled``.

    Parameters
    ----------
    total : int
        Aggregations the run is set to do (``max-aggregations``).
    label : str
        The strategy's name.
    enabled : bool or None
        Draw it (default: :func:`interactive`).
    """

    def __init__(self, total: int, label: str, *, enabled: bool | None = None) -> None:
        self.enabled = interactive() if enabled is None else enabled
        self.status = ""
        self.warning = ""
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not self.enabled,
        )
        self._task = self._progress.add_task(label, total=total, status="")
        self._started = False

    def update(
        self,
        version: int,
        *,
        accuracy: float | None = None,
        sim_time: float | None = None,
        warning: str | None = None,
    ) -> None:
        """The model reached ``version``; an evaluation also gives its accuracy, and a
        health warning (:mod:`fedsync.aggregation.health`) stays on the bar from then on."""
        if warning:
            self.warning = warning
        if accuracy is not None:
            self.status = f"acc {accuracy:.4f}" + (
                f"  sim {sim_time:.1f} s" if sim_time is not None else ""
            )
            if self.warning:
                self.status += f"  WARNING {self.warning}"
        if self.enabled and not self._started:
            self._progress.start()
            self._started = True
        self._progress.update(self._task, completed=version, status=self.status)

    def close(self) -> None:
        """Stop drawing (idempotent)."""
        if self._started:
            self._progress.stop()
            self._started = False
