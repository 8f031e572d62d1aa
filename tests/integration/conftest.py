"""Fixtures for integration tests: real Flower processes, stopped by process id."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def live_group_members(pgids: Iterable[int]) -> list[int]:
    """Pids of live processes whose process group is one of ``pgids`` (Linux /proc)."""
    wanted = set(pgids)
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start at ") ".
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in wanted and state != "Z":
            alive.append(int(entry.name))
    return alive


@pytest.fixture
def project_root() -> Path:
    """The Flower app folder (this repository)."""
    return PROJECT_ROOT


@pytest.fixture(autouse=True)
def _flower_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    # Ray inside the simulation must not see the test runner's thread settings.
    os.environ.pop("OMP_NUM_THREADS", None)
