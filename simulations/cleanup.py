"""Stop a simulation SuperLink and everything it started, by process id.

:meth:`fedsync.deploy.LocalSuperLink.stop` ends the SuperLink's process group. Flower
starts the SuperExec detached, in a session of its own, and the simulation process
(``flwr-simulation``, with Ray under it) in the SuperExec's group: when a run ends
normally they exit by themselves, but a run cut short (a timeout, Ctrl-C, SIGTERM) can
leave a simulation process behind. :func:`stop_superlink` notes the SuperLink's
descendants first, stops the SuperLink, then ends those still running -- each checked
by its start time, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["descendants", "stop_superlink"]

_PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(parent pid, state, start time)`` of a process, ``None`` when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces) start at ") ".
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid``: pid -> start time (Linux ``/proc``; empty
    elsewhere)."""
    if not _PROC.is_dir():
        return {}
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[1] == "Z":
            continue
        children.setdefault(stat[0], []).append(int(entry.name))
        started[int(entry.name)] = stat[2]
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = started[child]
                todo.append(child)
    return found


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] != "Z" and stat[2] == start


def _signal(pids: dict[int, int], signum: int) -> None:
    for pid, start in pids.items():
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


class _Link(Protocol):
    """What :func:`stop_superlink` needs of a :class:`fedsync.deploy.LocalSuperLink`."""

    @property
    def process(self) -> Any: ...

    def stop(self) -> None: ...


def stop_superlink(link: _Link, *, grace: float = 10.0) -> list[int]:
    """Stop ``link`` (a :class:`fedsync.deploy.LocalSuperLink`), then whatever it had
    started that is still running.

    Returns
    -------
    list of int
        The pids that outlived the SuperLink and were stopped here.
    """
    below = descendants(link.process.pid) if link.process is not None else {}
    link.stop()
    left = {pid: start for pid, start in below.items() if _alive(pid, start)}
    if not left:
        return []
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in left.items()):
        time.sleep(0.1)
    _signal(left, signal.SIGKILL)
    return sorted(left)
