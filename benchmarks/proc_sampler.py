"""Sample the resident memory of a process tree from ``/proc`` (Linux).

A :class:`TreeSampler` thread reads, every ``interval`` seconds, the ``VmRSS`` of a root
process and of every descendant (found through the ``ppid`` field of ``/proc/<pid>/stat``),
together with a caller-supplied progress number (e.g. updates so far), so memory can be
read against progress as well as against time. :func:`rss_report` turns the samples into
per-process peaks and post-warm-up slopes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """One reading: seconds since the sampler started, progress, pid -> RSS bytes."""

    t: float
    progress: int
    rss: dict[int, int]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces; the fields after it start at ") ".
    return stat[stat.rindex(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it (zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [root]
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


def process_name(pid: int) -> str:
    """A short name: Ray's process title (``ray::ClientAppActor``) or the executable."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    argv = [a for a in argv if a]
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


@dataclass
class TreeSampler:
    """A daemon thread sampling a process tree's RSS until :meth:`stop`.

    Parameters
    ----------
    root : int
        The tree's root pid.
    interval : float
        Seconds between samples.
    progress : callable
        Called at every sample; its int is stored with it (updates so far).
    """

    root: int
    interval: float = 1.0
    progress: Callable[[], int] = lambda: 0
    samples: list[Sample] = field(default_factory=list, init=False)
    names: dict[int, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> TreeSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10 * self.interval + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> Sample:
        """Take one sample now (also what the thread does)."""
        rss: dict[int, int] = {}
        for pid in descendants(self.root):
            value = rss_bytes(pid)
            if value is None:
                continue
            rss[pid] = value
            # Ray renames a worker once it hosts an actor: keep the newest name.
            self.names[pid] = process_name(pid)
        sample = Sample(round(time.monotonic() - self._t0, 3), int(self.progress()), rss)
        self.samples.append(sample)
        return sample


def _slope(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or float(np.ptp(x)) == 0.0:
        return None
    return float(np.polyfit(x, y, 1)[0])


def rss_report(
    samples: list[Sample], names: dict[int, str], *, warmup_progress: int
) -> dict[str, Any]:
    """Per-process and whole-tree RSS: peak, first/last, slope after warm-up.

    Slopes are least-squares fits over the samples taken once progress reached
    ``warmup_progress``: ``mb_per_1k_updates`` against progress, ``mb_per_minute``
    against time. A process that was not alive for at least three such samples has no
    slope.
    """
    mb = 1024.0 * 1024.0
    processes = []
    for pid in sorted({pid for s in samples for pid in s.rss}):
        seen = [s for s in samples if pid in s.rss]
        after = [s for s in seen if s.progress >= warmup_progress]
        x_u = np.array([s.progress for s in after], dtype=float)
        x_t = np.array([s.t for s in after], dtype=float)
        y = np.array([s.rss[pid] / mb for s in after])
        per_update, per_second = _slope(x_u, y), _slope(x_t, y)
        rss = [s.rss[pid] / mb for s in seen]
        processes.append(
            {
                "pid": pid,
                "name": names.get(pid, "?"),
                "first_seen_s": seen[0].t,
                "last_seen_s": seen[-1].t,
                "first_mb": round(rss[0], 1),
                "peak_mb": round(max(rss), 1),
                "last_mb": round(rss[-1], 1),
                "after_warmup_first_mb": round(float(y[0]), 1) if len(y) else None,
                "after_warmup_last_mb": round(float(y[-1]), 1) if len(y) else None,
                "mb_per_1k_updates": None if per_update is None else round(1000 * per_update, 2),
                "mb_per_minute": None if per_second is None else round(60 * per_second, 2),
            }
        )
    total = np.array([sum(s.rss.values()) / mb for s in samples])
    late = [i for i, s in enumerate(samples) if s.progress >= warmup_progress]
    slope_u = _slope(np.array([samples[i].progress for i in late], dtype=float), total[late])
    return {
        "warmup_updates": warmup_progress,
        "samples": len(samples),
        "processes": processes,
        "tree_peak_mb": round(float(total.max()), 1) if len(total) else None,
        "tree_mb_per_1k_updates": None if slope_u is None else round(1000 * slope_u, 2),
    }
