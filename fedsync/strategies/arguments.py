"""A strategy's keyword arguments as one checked :class:`~fedsync.config.RunConfig`.

Every argument is a fedsync run-config key in snake_case (``buffer_size`` is
``buffer-size``); objects stand in for strings where a user brings their own (a
staleness function, a server optimizer, compression schedules). Errors name the Python
argument (``TEASQ(bufer_size=...)``: did you mean ``buffer_size``?), not the run-config
key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedsync.aggregation.schedule import CompressionSchedule
from fedsync.aggregation.staleness import StalenessFunction
from fedsync.config import ConfigValue, RunConfig, SettingsError, check_keys

__all__ = ["LIBRARY_DEFAULTS", "as_staleness", "run_config_of"]

LIBRARY_DEFAULTS: Mapping[str, ConfigValue] = {
    "clock": "wall",
    "fleet": "",
    "plots": False,
    "checkpoint-every": 0,
}
"""Where a strategy object differs from the ``pyproject.toml`` defaults of fedsync's own
app: real time (no simulated fleet; ``clock="virtual"`` and a ``fleet`` for a simulated
one), no PNG plots and no server checkpoints unless asked for (``plots=True``,
``checkpoint_every=10``)."""

_KEY = re.compile(r"run config '([a-z0-9][a-z0-9-]*)'")


def _argument(key_name: str) -> str:
    return key_name.replace("-", "_")


def run_config_of(owner: str, strategy: str, arguments: Mapping[str, Any]) -> RunConfig:
    """The run config of ``owner(**arguments)`` (``owner``: the class name, for errors).

    Raises
    ------
    SettingsError
        An unknown argument, with the closest valid one, or an invalid value; both
        named as the Python argument.
    """
    values: dict[str, Any] = dict(LIBRARY_DEFAULTS)
    if "strategy" in arguments:
        raise SettingsError(
            f"{owner} runs strategy {strategy!r}; pick another class instead of passing strategy="
        )
    check_keys(arguments, owner=owner)
    for name, value in arguments.items():
        key_name = name.replace("_", "-")
        if name == "max_staleness" and value is None:
            values[key_name] = -1
        elif name == "staleness" and not isinstance(value, str):
            continue  # an object: the strategy keeps it (see Strategy.staleness)
        elif name == "server_optimizer" and not isinstance(value, str):
            continue  # an object: the engine steps with it
        elif name in ("uplink_codec", "downlink_delta_codec"):
            values.update(_schedule_keys(value, "" if name == "uplink_codec" else "downlink-"))
        else:
            values[key_name] = value
    try:
        config = RunConfig.from_run_config({**values, "strategy": strategy})
        # The codecs as the engine builds them: a misspelled stage is refused now.
        config.compression.check_codecs()
        return config
    except SettingsError as err:
        message = _KEY.sub(lambda found: f"{owner}({_argument(found[1])}=...)", str(err))
        raise SettingsError(message) from err


@dataclass(frozen=True)
class _CallableStaleness(StalenessFunction):
    """Any ``staleness -> weight`` callable as a staleness function."""

    function: Callable[[int], float]

    def weight(self, staleness: int) -> float:
        return float(self.function(staleness))

    def spec(self) -> str:
        return f"custom:{getattr(self.function, '__name__', type(self.function).__name__)}"


def as_staleness(value: StalenessFunction | Callable[[int], float]) -> StalenessFunction:
    """A staleness argument that is not a spec, as a :class:`StalenessFunction`."""
    if isinstance(value, StalenessFunction):
        return value
    if not callable(value):
        raise SettingsError(
            f"staleness must be a spec, a StalenessFunction or a callable: {value!r}"
        )
    return _CallableStaleness(value)


def _schedule_keys(value: str | CompressionSchedule, prefix: str) -> dict[str, ConfigValue]:
    """A codec argument as run-config keys (``prefix``: ``""`` uplink, ``"downlink-"``)."""
    codec_key = "uplink-codec" if not prefix else "downlink-delta-codec"
    if isinstance(value, str):
        return {codec_key: value}
    if not isinstance(value, CompressionSchedule):
        raise SettingsError(
            f"{_argument(codec_key)} must be a spec or a CompressionSchedule: {value!r}"
        )
    return {
        codec_key: value.template,
        f"{prefix}density-start": value.density_start,
        f"{prefix}density-floor": value.density_floor,
        f"{prefix}density-decay": value.density_decay,
        f"{prefix}bits-start": value.bits_start,
        f"{prefix}bits-floor": value.bits_floor,
        f"{prefix}bits-decay": value.bits_decay,
        "decay-kind": value.kind,
    }
