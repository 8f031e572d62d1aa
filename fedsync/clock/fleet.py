"""Fleets: named sets of device profiles, loaded from TOML and assigned to SuperNodes.

A fleet file (``fedsync/clock/fleets/<name>.toml``) lists groups of identical devices::

    name = "digits-stragglers"
    description = "..."

    [[group]]
    name = "laptop"
    count = 7
    seconds-per-sample = 0.001
    uplink-mbit = 20
    downlink-mbit = 20
    latency-ms = 20

(keys of a group: see :meth:`~fedsync.clock.profiles.DeviceProfile.from_mapping`).
:meth:`FleetSpec.assign` maps Flower node ids to profiles -- in node-id order (group by
group, cycling when there are more nodes than devices) or by a seeded shuffle -- and
returns a :class:`Fleet` that answers :meth:`Fleet.profile_for`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedsync.clock.profiles import DEFAULT_PROFILE, DeviceProfile

__all__ = ["Assignment", "Fleet", "FleetSpec", "fleet_search_path", "load_fleet"]

Assignment = Literal["order", "random"]


@dataclass(frozen=True)
class FleetSpec:
    """A fleet as written in its file: groups of profiles with counts.

    Parameters
    ----------
    name : str
        The fleet's name.
    groups : tuple of (DeviceProfile, int)
        Each profile and how many devices have it (``>= 1``).
    description : str
        Free text.
    """

    name: str
    groups: tuple[tuple[DeviceProfile, int], ...]
    description: str = ""

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"fleet {self.name!r} has no device groups")
        for profile, count in self.groups:
            if count < 1:
                raise ValueError(f"fleet {self.name!r}: group {profile.name!r} count must be >= 1")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, name: str = "") -> FleetSpec:
        """Build a fleet from parsed TOML (see the module docstring).

        Raises
        ------
        ValueError
            If there is no ``[[group]]``, a count is not a positive integer, or a
            profile is invalid.
        """
        fleet_name = str(data.get("name", name or "fleet"))
        raw_groups = data.get("group", [])
        if not isinstance(raw_groups, list) or not raw_groups:
            raise ValueError(f"fleet {fleet_name!r} needs at least one [[group]] table")
        groups: list[tuple[DeviceProfile, int]] = []
        for position, raw in enumerate(raw_groups):
            if not isinstance(raw, Mapping):
                raise ValueError(f"fleet {fleet_name!r}: group #{position} is not a table")
            count = raw.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise ValueError(
                    f"fleet {fleet_name!r}: group #{position} count must be an integer >= 1, "
                    f"got {count!r}"
                )
            profile = DeviceProfile.from_mapping(raw, name=f"{fleet_name}-{position}")
            groups.append((profile, count))
        return cls(fleet_name, tuple(groups), str(data.get("description", "")))

    @classmethod
    def from_toml(cls, path: Path) -> FleetSpec:
        """Load a fleet file."""
        with path.open("rb") as file:
            data = tomllib.load(file)
        return cls.from_mapping(data, name=path.stem)

    @property
    def profiles(self) -> list[DeviceProfile]:
        """One profile per device, group by group in file order."""
        return [profile for profile, count in self.groups for _ in range(count)]

    def __len__(self) -> int:
        return sum(count for _, count in self.groups)

    def assign(
        self,
        node_ids: Iterable[int],
        *,
        how: Assignment = "order",
        seed: int = 0,
        key: Callable[[int], Any] | None = None,
    ) -> Fleet:
        """Give every node a profile.

        Parameters
        ----------
        node_ids : iterable of int
            Flower node ids (sorted first, so the result does not depend on the order
            the SuperLink lists them in).
        how : {"order", "random"}
            ``"order"``: the i-th node gets the i-th device of the file (cycling);
            ``"random"``: the device list is shuffled with ``seed`` first.
        seed : int
            Seed of the shuffle.
        key : callable, optional
            Sort key of the nodes (default: the node id). Flower draws node ids at
            random in every simulation, so a stable key such as the node's partition
            id makes the assignment the same from run to run.
        """
        if how not in ("order", "random"):
            raise ValueError(f"fleet assignment must be 'order' or 'random', got {how!r}")
        devices = self.profiles
        if how == "random":
            order = np.random.default_rng([seed, 0xF1EE7]).permutation(len(devices))
            devices = [devices[i] for i in order]
        fleet = Fleet(self, devices)
        for node_id in sorted(node_ids, key=key):
            fleet.add(node_id)
        return fleet


@dataclass
class Fleet:
    """A fleet assigned to nodes: :meth:`profile_for` answers per node id.

    Nodes that join later (:meth:`add`) take the next device in the (possibly shuffled)
    device list, cycling.
    """

    spec: FleetSpec
    devices: list[DeviceProfile]
    assigned: dict[int, DeviceProfile] = field(default_factory=dict)

    def add(self, node_id: int) -> DeviceProfile:
        """Assign the next device to ``node_id`` (no-op if it has one)."""
        if node_id not in self.assigned:
            self.assigned[node_id] = self.devices[len(self.assigned) % len(self.devices)]
        return self.assigned[node_id]

    def profile_for(self, node_id: int) -> DeviceProfile:
        """The profile of ``node_id``.

        Raises
        ------
        KeyError
            If the node was never assigned.
        """
        try:
            return self.assigned[node_id]
        except KeyError:
            raise KeyError(
                f"node {node_id} has no device profile in fleet {self.spec.name!r}"
            ) from None

    def describe(self) -> dict[str, str]:
        """Node id (as str) -> profile name, for the run summary."""
        return {str(node): profile.name for node, profile in sorted(self.assigned.items())}


def fleet_search_path() -> list[Path]:
    """Folders searched for ``<name>.toml``: the fleets that ship with fedsync
    (``fedsync/clock/fleets``)."""
    return [Path(__file__).resolve().parent / "fleets"]


def load_fleet(name_or_path: str) -> FleetSpec:
    """Load a fleet by name (``"edge-mixed"``) or path; ``""`` gives the uniform fleet.

    Raises
    ------
    FileNotFoundError
        If no file matches, naming where it looked.
    """
    if not name_or_path.strip():
        return FleetSpec("uniform", ((DEFAULT_PROFILE, 1),), "every device the default profile")
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix == ".toml" and candidate.is_file():
        return FleetSpec.from_toml(candidate)
    tried = []
    for folder in fleet_search_path():
        path = folder / f"{name_or_path}.toml"
        tried.append(str(path))
        if path.is_file():
            return FleetSpec.from_toml(path)
    raise FileNotFoundError(f"fleet {name_or_path!r} not found; looked in {tried}")
