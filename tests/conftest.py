"""Shared fixtures: where the real datasets live for tests."""

from __future__ import annotations

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Tests read the real data from ../shared/data beside the project (the team layout); a
# copy of the tree that carries shared/ inside it (e.g. on a device machine) also works.
_DATA_CANDIDATES = (PROJECT_ROOT.parent / "shared" / "data", PROJECT_ROOT / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The folder of real datasets (``fashion-mnist/``, ``mnist/``, ``shakespeare/``).

    Skips the test when it is absent, so a bare checkout still runs the rest.
    """
    for candidate in _DATA_CANDIDATES:
        if candidate.is_dir():
            return candidate
    pytest.skip(f"shared data not found (looked in {', '.join(map(str, _DATA_CANDIDATES))})")
