"""Typed reads of the scalar values Flower carries in ConfigRecords and MetricRecords.

Flower types a record's values as a union of scalars and lists; a value that a peer
sent with the wrong type should fail with a message naming the key, not deep inside
training. These helpers take any mapping, so the core needs no ``flwr`` import. The
module imports nothing heavy (no torch, no ``flwr``), so :mod:`fedsync.protocol` and
:mod:`fedsync.config` share :data:`ConfigValue` from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ConfigValue = bool | int | float | str
"""One value of a run config or of a task's ConfigRecord: a TOML scalar (what
``[tool.flwr.app.config]`` holds, and what :attr:`fedsync.protocol.TrainTask.extra`
carries beside fedsync's own keys)."""


class RecordValueError(ValueError):
    """A record value is missing or of the wrong type."""


def get_int(record: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """``record[key]`` as an int (a float with an integral value is accepted)."""
    value = _get(record, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordValueError(f"record key {key!r} must be an int, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise RecordValueError(f"record key {key!r} must be an int, got {value!r}")
    return int(value)


def get_float(record: Mapping[str, Any], key: str, default: float | None = None) -> float:
    """``record[key]`` as a float."""
    value = _get(record, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordValueError(f"record key {key!r} must be a number, got {value!r}")
    return float(value)


def get_str(record: Mapping[str, Any], key: str, default: str | None = None) -> str:
    """``record[key]`` as a str."""
    value = _get(record, key, default)
    if not isinstance(value, str):
        raise RecordValueError(f"record key {key!r} must be a string, got {value!r}")
    return value


def get_bool(record: Mapping[str, Any], key: str, default: bool | None = None) -> bool:
    """``record[key]`` as a bool."""
    value = _get(record, key, default)
    if not isinstance(value, bool):
        raise RecordValueError(f"record key {key!r} must be a bool, got {value!r}")
    return value


def _get(record: Mapping[str, Any], key: str, default: Any) -> Any:
    if key in record:
        return record[key]
    if default is None:
        raise RecordValueError(f"record lacks the key {key!r}")
    return default
