"""An append-only JSON-lines event log, flushed line by line so a killed run keeps it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any


class EventLog:
    """Append events as JSON lines to ``path``.

    Every event gets ``event`` (its kind) and ``wall_time`` (seconds since the log was
    opened) before the caller's fields. Lines are flushed as they are written: the log
    is the record of a run, and a run can be killed.

    Parameters
    ----------
    path : pathlib.Path
        The file to append to; its folder is created.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._t0 = time.monotonic()

    def write(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        """Append one event and return it as written.

        A field named like one every line carries (``event``, ``wall_time``: a user's
        metric, merged into an evaluation line) is kept as ``<name>_`` and takes
        nothing from the line.
        """
        record: dict[str, Any] = {
            "event": kind,
            "wall_time": round(time.monotonic() - self._t0, 4),
        }
        for name, value in fields.items():
            record[f"{name}_" if name in ("event", "wall_time") else name] = value
        self._file.write(json.dumps(record, sort_keys=False, default=_jsonable) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        """Close the file; further writes raise."""
        self._file.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_events(path: Path, kind: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events of a log, optionally only those of one kind."""
    with path.open(encoding="utf-8") as file:
        for line in file:
            if not line.strip():
                continue
            record: dict[str, Any] = json.loads(line)
            if kind is None or record.get("event") == kind:
                yield record


def _jsonable(value: Any) -> Any:
    # numpy scalars and arrays reach the log from metrics; store them as plain JSON.
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
