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
from typing import Any

import numpy as np

from fedsync.deploy.proctree import descendants, process_name, rss_bytes


@dataclass(frozen=True)
class Sample:
    """One reading: seconds since the sampler started, progress, pid -> RSS bytes."""

    t: float
    progress: int
    rss: dict[int, int]


@dataclass
class TreeSampler:
    """A daemon thread sampling a process tree's RSS until :meth:`stop`.

    Parameters
    ----------
    root : int
        The tree's root pid.
    extra_roots : list of int
        More trees sampled with it (the nodes of a Ray cluster the run joined).
    interval : float
        Seconds between samples.
    progress : callable
        Called at every sample; its int is stored with it (updates so far).
    """

    root: int
    extra_roots: list[int] = field(default_factory=list)
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
        roots = (self.root, *self.extra_roots)
        for pid in dict.fromkeys(pid for root in roots for pid in descendants(root)):
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
    ``warmup_progress`` and until it reached its final value (later samples are the
    teardown): ``mb_per_1k_updates`` against progress, ``mb_per_minute``
    against time. A process that was not alive for at least three such samples has no
    slope.
    """
    mb = 1024.0 * 1024.0
    # The window ends when progress reached its last value: later samples are teardown.
    final = max((s.progress for s in samples), default=0)
    end = next((s.t for s in samples if s.progress == final), float("inf"))
    processes = []
    for pid in sorted({pid for s in samples for pid in s.rss}):
        seen = [s for s in samples if pid in s.rss]
        after = [s for s in seen if s.progress >= warmup_progress and s.t <= end]
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
    late = [i for i, s in enumerate(samples) if s.progress >= warmup_progress and s.t <= end]
    slope_u = _slope(np.array([samples[i].progress for i in late], dtype=float), total[late])
    return {
        "warmup_updates": warmup_progress,
        "samples": len(samples),
        "processes": processes,
        "tree_peak_mb": round(float(total.max()), 1) if len(total) else None,
        "tree_mb_per_1k_updates": None if slope_u is None else round(1000 * slope_u, 2),
    }
