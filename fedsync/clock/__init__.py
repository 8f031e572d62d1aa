"""Time for the asynchronous loop: device profiles, fleets, the virtual and wall clocks."""

from fedsync.clock.base import Clock, ClockEvent, EventKind, TaskWork
from fedsync.clock.fleet import Fleet, FleetSpec, fleet_search_path, load_fleet
from fedsync.clock.profiles import DEFAULT_PROFILE, DeviceProfile
from fedsync.clock.virtual import VirtualClock
from fedsync.clock.wall import WallClock

__all__ = [
    "DEFAULT_PROFILE",
    "Clock",
    "ClockEvent",
    "DeviceProfile",
    "EventKind",
    "Fleet",
    "FleetSpec",
    "TaskWork",
    "VirtualClock",
    "WallClock",
    "fleet_search_path",
    "load_fleet",
]
