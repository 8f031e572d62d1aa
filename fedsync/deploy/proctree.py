"""Process trees and resident memory, read from ``/proc`` (Linux only).

Daemons that detach from their parent's process group (Flower's SuperExec, Ray's
raylet and workers) are still its descendants by ``ppid`` while the parent lives, so a
tree walk finds everything a started process spawned: to stop it by pid, or to sample
its memory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces; the fields after it start at ") ".
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(root: int) -> list[int]:
    """``root`` (when alive) and every live process below it, zombies left out."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found = [root] if alive(root) else []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def rss_bytes(pid: int) -> int | None:
    """``VmRSS`` of ``pid`` in bytes, or None when it is gone (or a kernel thread)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` (empty when it is gone)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part for part in raw.decode(errors="replace").split("\0") if part]


def process_name(pid: int) -> str:
    """A short name: Ray's process title (``ray::ClientAppActor``) or the program."""
    argv = cmdline(pid)
    if not argv:
        return "?"
    first = argv[0]
    if first.startswith("ray::"):
        return first.split()[0]
    # "python -m x" / "python /path/flwr-simulation": name the script, not the interpreter.
    if Path(first).name.startswith("python") and len(argv) > 1:
        rest = argv[2] if argv[1] == "-m" and len(argv) > 2 else argv[1]
        return Path(rest).name
    return Path(first).name


def terminate_pids(pids: Iterable[int], grace: float = 10.0) -> list[int]:
    """SIGTERM each pid, wait up to ``grace`` seconds, SIGKILL the rest; the killed ones."""
    pids = [pid for pid in pids if alive(pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    killed = []
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
