"""Where a result came from: the ``provenance`` block a result's JSON carries.

A comparison (:mod:`fedsync.simulations.report`) or a benchmark writes
:func:`provenance` into its JSON next to its numbers: the command that produced them,
the git commit of the code, the date, and the machine (CPU count, load average, the
Python, torch and Flower versions). The results pages under ``docs/results/``
(:mod:`fedsync.simulations.pages`) take these facts from the JSON; only results written
before the block existed need them in ``docs/results/sources.toml``.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "machine", "provenance"]

_ROOT = Path(__file__).resolve().parents[2]


def git_commit(root: Path | None = None) -> str | None:
    """The short hash of ``HEAD`` in ``root``'s checkout, with ``+dirty`` when a tracked
    file differs from it; ``None`` outside a git checkout (an installed package).

    ``FEDSYNC_COMMIT``, when set, is returned instead: a copy of the tree sent to another
    machine (:mod:`benchmarks.gpu_check`) names the commit it was copied from, since the
    copy's own ``.git`` (if any travelled) may be older than its files."""
    if named := os.environ.get("FEDSYNC_COMMIT"):
        return named
    cwd = root or _ROOT

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + "+dirty" if dirty else head) or None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The host as a result depends on it: CPU count, the load average (1, 5 and 15
    minutes) now, the platform and the Python, torch and Flower versions."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        load = None
    return {
        "cpus": os.cpu_count(),
        "load_average": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "flwr": _version("flwr"),
    }


def provenance(program: str, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``provenance`` block of a result's JSON.

    Parameters
    ----------
    program : str
        How the command is invoked, e.g. ``"python -m fedsync.simulations.compare"``.
    argv : sequence of str, optional
        Its arguments (default: this process's ``sys.argv[1:]``).

    Returns
    -------
    dict
        ``command`` (shell-quoted), ``commit`` (:func:`git_commit`), ``date`` (UTC, ISO
        8601, to the second) and ``machine`` (:func:`machine`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": " ".join([program, *(shlex.quote(a) for a in args)]),
        "commit": git_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
