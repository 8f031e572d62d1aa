"""Device profiles: how fast a simulated device computes, talks and stays online.

A :class:`DeviceProfile` turns the facts of one task -- real payload sizes and the work
actually done -- into simulated seconds:

``duration = downlink_bytes * 8 / downlink_bps + compute + uplink_bytes * 8 / uplink_bps + latency``

with ``compute = seconds_per_sample * samples + seconds_per_batch * steps``. Availability
is either a per-task ``dropout`` probability (the device vanishes mid-task) or a
deterministic on/off cycle (``online_seconds`` on, ``offline_seconds`` off, with a
per-device phase the clock draws from the seed); a task that runs into an offline
period either pauses until the device is back (``offline_behavior = "delay"``) or is
lost (``"drop"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DEFAULT_PROFILE", "DeviceProfile", "OfflineBehavior"]

OfflineBehavior = Literal["delay", "drop"]

_MBIT = 1e6


@dataclass(frozen=True)
class DeviceProfile:
    """Compute speed, link speeds, latency and availability of one kind of device.

    Parameters
    ----------
    name : str
        A label for reports (``"jetson-nano"``, ``"phone-3g"``).
    seconds_per_sample : float
        Simulated compute seconds per training example processed, ``>= 0``.
    seconds_per_batch : float
        Simulated compute seconds per optimizer step, ``>= 0`` (added to the above).
    uplink_bps, downlink_bps : float
        Link speeds in bit/s, ``> 0`` (``inf`` allowed: free transfers).
    latency : float
        Seconds added once per task (connection set-up, round-trip delays), ``>= 0``.
    dropout : float
        Probability a task is lost (the device disappears mid-task), in ``[0, 1)``.
    online_seconds, offline_seconds : float
        An availability cycle: ``online_seconds`` on, then ``offline_seconds`` off,
        repeating. ``offline_seconds = 0`` (default) means always online.
    offline_behavior : {"delay", "drop"}
        What an offline period does to a running task: pause it, or lose it.
    """

    name: str = "device"
    seconds_per_sample: float = 1e-3
    seconds_per_batch: float = 0.0
    uplink_bps: float = 10 * _MBIT
    downlink_bps: float = 10 * _MBIT
    latency: float = 0.05
    dropout: float = 0.0
    online_seconds: float = math.inf
    offline_seconds: float = 0.0
    offline_behavior: OfflineBehavior = "delay"

    def __post_init__(self) -> None:
        where = f"device profile {self.name!r}"
        for key, value in (
            ("seconds-per-sample", self.seconds_per_sample),
            ("seconds-per-batch", self.seconds_per_batch),
            ("latency", self.latency),
        ):
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{where}: {key} must be finite and >= 0, got {value}")
        for key, value in (("uplink", self.uplink_bps), ("downlink", self.downlink_bps)):
            if not value > 0.0:  # also refuses NaN
                raise ValueError(f"{where}: {key} bandwidth must be > 0 bit/s, got {value}")
        if not 0.0 <= self.dropout < 1.0:
            # dropout 1 would lose every task: the device could never contribute.
            raise ValueError(f"{where}: dropout must be in [0, 1), got {self.dropout}")
        if not self.online_seconds > 0.0:
            raise ValueError(f"{where}: online-seconds must be > 0, got {self.online_seconds}")
        if not (math.isfinite(self.offline_seconds) and self.offline_seconds >= 0.0):
            raise ValueError(
                f"{where}: offline-seconds must be finite and >= 0, got {self.offline_seconds}"
            )
        if self.offline_seconds > 0.0 and not math.isfinite(self.online_seconds):
            raise ValueError(f"{where}: an offline period needs a finite online-seconds")
        if self.offline_behavior not in ("delay", "drop"):
            raise ValueError(
                f"{where}: offline-behavior must be 'delay' or 'drop', "
                f"got {self.offline_behavior!r}"
            )

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, name: str | None = None) -> DeviceProfile:
        """Build a profile from fleet-file keys (kebab-case, human units).

        Keys: ``seconds-per-sample``, ``seconds-per-batch``, ``uplink-mbit``,
        ``downlink-mbit`` (Mbit/s), ``latency-ms``, ``dropout``, ``online-seconds``,
        ``offline-seconds``, ``offline-behavior``; plus ``name``.

        Raises
        ------
        ValueError
            On an unknown key or a value out of range.
        """
        known = {
            "name",
            "count",
            "seconds-per-sample",
            "seconds-per-batch",
            "uplink-mbit",
            "downlink-mbit",
            "latency-ms",
            "dropout",
            "online-seconds",
            "offline-seconds",
            "offline-behavior",
        }
        label = str(values.get("name", name or "device"))
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"device profile {label!r}: unknown keys {unknown}; known: {sorted(known)}"
            )
        default = cls()
        return cls(
            name=label,
            seconds_per_sample=float(values.get("seconds-per-sample", default.seconds_per_sample)),
            seconds_per_batch=float(values.get("seconds-per-batch", default.seconds_per_batch)),
            uplink_bps=float(values.get("uplink-mbit", default.uplink_bps / _MBIT)) * _MBIT,
            downlink_bps=float(values.get("downlink-mbit", default.downlink_bps / _MBIT)) * _MBIT,
            latency=float(values.get("latency-ms", default.latency * 1e3)) / 1e3,
            dropout=float(values.get("dropout", default.dropout)),
            online_seconds=float(values.get("online-seconds", default.online_seconds)),
            offline_seconds=float(values.get("offline-seconds", default.offline_seconds)),
            offline_behavior=values.get("offline-behavior", default.offline_behavior),
        )

    # --- timing -------------------------------------------------------------------------
    def compute_seconds(self, samples: int, steps: int) -> float:
        """Simulated training time for ``samples`` examples in ``steps`` optimizer steps."""
        return self.seconds_per_sample * max(samples, 0) + self.seconds_per_batch * max(steps, 0)

    def downlink_seconds(self, nbytes: int) -> float:
        """Seconds to receive ``nbytes`` (the real payload length)."""
        return nbytes * 8.0 / self.downlink_bps

    def uplink_seconds(self, nbytes: int) -> float:
        """Seconds to send ``nbytes`` (the real payload length)."""
        return nbytes * 8.0 / self.uplink_bps

    # --- availability -------------------------------------------------------------------
    @property
    def intermittent(self) -> bool:
        """Whether the device has offline periods."""
        return self.offline_seconds > 0.0

    @property
    def period(self) -> float:
        """Length of one on/off cycle (``inf`` when always online)."""
        return self.online_seconds + self.offline_seconds if self.intermittent else math.inf

    def is_online(self, time: float, phase: float = 0.0) -> bool:
        """Whether the device is online at simulated ``time`` (cycle shifted by ``phase``)."""
        if not self.intermittent:
            return True
        return (time + phase) % self.period < self.online_seconds

    def next_online(self, time: float, phase: float = 0.0) -> float:
        """The first moment ``>= time`` the device is online."""
        if self.is_online(time, phase):
            return time
        position = (time + phase) % self.period
        return time + (self.period - position)

    def online_until(self, time: float, phase: float = 0.0) -> float:
        """End of the online window containing ``time`` (``time`` itself if offline)."""
        if not self.intermittent:
            return math.inf
        if not self.is_online(time, phase):
            return time
        position = (time + phase) % self.period
        return time + (self.online_seconds - position)

    def finish(self, start: float, work: float, phase: float = 0.0) -> tuple[float, bool]:
        """When ``work`` seconds of online activity begun at ``start`` end.

        Returns
        -------
        (float, bool)
            ``(end, lost)``: with ``"delay"``, the work pauses through offline periods
            and ``lost`` is False; with ``"drop"``, a task that meets an offline period
            is lost at its start (``end`` = when the device went offline).
        """
        if not self.intermittent:
            return start + work, False
        if self.offline_behavior == "drop":
            until = self.online_until(start, phase)
            if start + work > until:
                return until, True
            return start + work, False
        # Walk the cycle by its integer index k (window k is online on
        # [k P, k P + on) in shifted time): k strictly grows, so the walk ends after about
        # work / online_seconds steps whatever floating-point rounding does at the edges.
        period, shifted, left = self.period, start + phase, work
        k = math.floor(shifted / period)
        if shifted - k * period >= self.online_seconds:
            k += 1
            shifted = k * period
        while True:
            window_end = k * period + self.online_seconds
            if shifted + left <= window_end:
                return shifted + left - phase, False
            left -= window_end - shifted
            k += 1
            shifted = k * period


DEFAULT_PROFILE = DeviceProfile(name="uniform")
"""The profile of every device when no fleet is named: 10 Mbit/s both ways, 1 ms per
example, 50 ms latency, always online."""
