"""Where fedsync leans on a Flower version's internals: one module per Flower version.

:mod:`fedsync.compat.flower139` is the only place in fedsync that imports Flower's
internal modules or reaches its private names (``tests/unit/test_flower_compat.py``
checks it); its docstring defines the public API every other module keeps to.
"""

from __future__ import annotations

import sys
from typing import Final

SIMULATION_ENGINE: Final = "flwr.server.superlink.fleet.vce.vce_api"
"""Flower's simulation engine module: imported in the process that runs a simulation
(``flwr-simulation``), not in a SuperNode's or a ClientApp's own process."""


def in_simulation_engine() -> bool:
    """Whether this process runs Flower's simulation engine (checked without importing
    Flower's internals, which cost a ClientApp process about a second)."""
    return SIMULATION_ENGINE in sys.modules
