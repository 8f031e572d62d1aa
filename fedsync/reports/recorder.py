"""A run's results folder: event log, summary and plot, in one place."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fedsync.reports.event_log import EventLog


class RunRecorder:
    """Owns one results folder: ``events.jsonl``, ``summary.json``, ``accuracy.png``.

    Parameters
    ----------
    results_dir : pathlib.Path
        The parent folder (the ``results-dir`` run config).
    run_name : str
        The run's folder name inside ``results_dir``; a timestamped name is made when
        empty, so runs never overwrite each other.
    """

    def __init__(self, results_dir: Path, run_name: str = "") -> None:
        name = run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.folder = results_dir / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.folder / "events.jsonl")

    @property
    def events_path(self) -> Path:
        """The JSON-lines event log."""
        return self.events.path

    @property
    def summary_path(self) -> Path:
        """The run's ``summary.json``."""
        return self.folder / "summary.json"

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary.json`` atomically (temp file + rename)."""
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        tmp.replace(self.summary_path)
        return self.summary_path

    def close(self) -> None:
        """Close the event log."""
        self.events.close()
