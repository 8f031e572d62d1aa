"""Soak: SuperNodes for minutes; memory must level off and no update may be lost.

Two paths, SuperNodes authenticated over TLS as deployed, ``strategy=teasq clock=wall``:

* ``stock`` (``LocalDeployment``, a ClientApp process per message):
  ``FEDSYNC_SOAK_NODES`` (default 16) SuperNodes for ``FEDSYNC_SOAK_MINUTES`` (default
  1.25) minutes of wall time;
* ``warm`` (``WarmLocalDeployment``: ``fedsync-node``, a long-lived executor per node
  holding about 1 GB): ``FEDSYNC_SOAK_WARM_NODES`` (default 3) nodes for
  ``FEDSYNC_SOAK_WARM_MINUTES`` (default 1) minutes.

A sampler thread reads, every ``FEDSYNC_SOAK_INTERVAL`` seconds (default 1) from
``/proc``, the resident memory of the
SuperLink, of the ServerApp (``flwr-serverapp``, below the SuperLink's SuperExec) and
of every SuperNode's process group (stock: the node, its SuperExec and the ClientApp
process of the task it runs; warm: the node, the supervisor and the executor).

It asserts that

* the ServerApp and the SuperLink do not keep growing: the median RSS of the last
  third of the run is within 15 % of the middle third's (the first third is start-up:
  imports, data, the first tasks);
* warm: neither does each node's process group, from its first reply on (the executor
  then holds its imports, data and model): the same thirds rule;
* no update is lost: every arrival in the event log was aggregated, still cached at
  the end, or dropped for a counted reason; every task dispatched arrived, failed
  (counted) or was still in flight at the end;

and writes the series and the counts to ``<tmp>/results/soak/soak.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedsync.deploy.timing import parse_supernode_log
from fedsync.reports import read_events
from tests.integration.conftest import PATHS, deployment_kind, live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SIZES = {
    "stock": (
        int(os.environ.get("FEDSYNC_SOAK_NODES", "16")),
        float(os.environ.get("FEDSYNC_SOAK_MINUTES", "1.25")),
    ),
    "warm": (
        int(os.environ.get("FEDSYNC_SOAK_WARM_NODES", "3")),
        float(os.environ.get("FEDSYNC_SOAK_WARM_MINUTES", "1")),
    ),
}
"""Nodes and minutes of wall time per path. CI's defaults are half the 2.5 and 2 minutes
they were, sampled twice as often: the same number of samples per third."""
SAMPLE_INTERVAL = float(os.environ.get("FEDSYNC_SOAK_INTERVAL", "1.0"))
"""Seconds between two samples of ``/proc``."""
GROWTH_LIMIT = 0.15


# --- /proc -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Proc:
    """One live process as ``/proc`` shows it."""

    pid: int
    ppid: int
    pgid: int
    rss_mb: float
    command: str


def processes() -> dict[int, Proc]:
    """Every live process, read in one pass over ``/proc`` (zombies have no RSS: 0)."""
    found: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        rss = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
        )
        found[int(entry.name)] = Proc(
            int(entry.name), int(fields[1]), int(fields[2]), rss / 1024.0, command
        )
    return found


@dataclass
class Sampler:
    """Samples, on a thread, the RSS of the SuperLink, the ServerApp, and each SuperNode
    group (split into the node's own processes and its ClientApp of the moment)."""

    link_pid: int
    node_pids: list[int]
    interval: float = 2.0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(self.sample())

    def sample(self) -> dict[str, Any]:
        table = processes()
        serverapp = [
            p
            for p in table.values()
            if "flwr-serverapp" in p.command and self._below_link(p, table)
        ]
        resident, clientapps = [], []
        for node in self.node_pids:
            group = [p for p in table.values() if p.pgid == node]
            resident.append(sum(p.rss_mb for p in group if "flwr-clientapp" not in p.command))
            clientapps += [p.rss_mb for p in group if "flwr-clientapp" in p.command]
        link = table.get(self.link_pid)
        return {
            "t": round(time.monotonic() - self._t0, 2),
            "wall": round(time.time(), 2),
            "superlink_mb": round(link.rss_mb, 1) if link else None,
            "serverapp_mb": round(serverapp[0].rss_mb, 1) if serverapp else None,
            "supernode_mb": [round(mb, 1) for mb in resident],
            "clientapp_mb": [round(mb, 1) for mb in clientapps],
        }

    def _below_link(self, proc: Proc, table: dict[int, Proc]) -> bool:
        while proc.ppid in table:
            if proc.ppid == self.link_pid:
                return True
            proc = table[proc.ppid]
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def growth_of(series: list[tuple[float, float]]) -> dict[str, float]:
    """The thirds of a ``(t, mb)`` series and the last third's growth over the middle's."""
    first, middle, last = thirds(series)
    return {
        "first_third_mb": round(first, 1),
        "middle_third_mb": round(middle, 1),
        "last_third_mb": round(last, 1),
        "start_mb": round(series[0][1], 1),
        "end_mb": round(series[-1][1], 1),
        "growth": round(last / middle - 1.0, 4),
    }


def thirds(series: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Medians of the first, middle and last third (by time) of ``(t, value)`` pairs."""
    start, end = series[0][0], series[-1][0]
    span = (end - start) / 3.0
    parts: list[list[float]] = [[], [], []]
    for t, value in series:
        parts[min(2, int((t - start) / span))].append(value)
    medians = [statistics.median(part) for part in parts]
    return medians[0], medians[1], medians[2]


# --- the soak ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_soak(path: str, tmp_path: Path, project_root: Path) -> None:
    size, minutes = SIZES[path]
    results = tmp_path / "results"
    nodes = [
        {"partition-id": i, "num-partitions": size, "state-dir": str(tmp_path / f"state-{i}")}
        for i in range(size)
    ]
    kind = deployment_kind(path)
    deployment = kind(tmp_path / "run", nodes)
    started = time.monotonic()
    deployment.start()
    start_seconds = time.monotonic() - started
    pids = deployment.pids()
    assert deployment.link.process is not None
    sampler = Sampler(deployment.link.process.pid, pids[:-1], interval=SAMPLE_INTERVAL)
    try:
        outcome = deployment.run_app(
            project_root,
            {
                "strategy": "teasq",
                "clock": "wall",
                "concurrency": min(4, size),
                "buffer-size": min(3, size - 1),
                "max-aggregations": 100_000,
                "max-wall-time": minutes * 60.0,
                "eval-every": 10,
                "checkpoint-every": 10,
                "local-epochs": 1,
                "min-nodes": size,
                "probe-timeout": 0.0,
                "plots": False,
                "results-dir": str(results),
                "run-name": "soak",
            },
            timeout=minutes * 60.0 + 600.0,
        )
    finally:
        sampler.stop()
        deployment.stop()
    assert live_group_members(pids) == []
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"

    folder = results / "soak"
    summary = json.loads((folder / "summary.json").read_text())
    events = list(read_events(folder / "events.jsonl"))

    def count(kind: str) -> int:
        return sum(e["event"] == kind for e in events)

    # --- no update lost --------------------------------------------------------------------
    aggregated = sum(e["updates"] for e in events if e["event"] == "aggregation")
    drops = [e for e in events if e["event"] == "drop"]
    stale = sum(e["reason"] == "stale" for e in drops)
    rejected = sum(e["reason"] == "rejected" for e in drops)
    lost = len(drops) - stale - rejected  # availability losses (none on the wall clock)
    discarded = summary["updates_discarded_at_end"]
    arrivals = count("arrival")
    assert arrivals == summary["arrivals"] == aggregated + discarded + stale + rejected
    assert count("dispatch") == summary["tasks"]
    in_flight = summary["tasks_in_flight_at_end"]
    assert summary["tasks"] == arrivals + count("error") + lost + in_flight
    assert summary["errors_total"] == 0 and rejected == 0, summary["errors"]

    # --- memory levels off -----------------------------------------------------------------
    serverapp = [(s["t"], s["serverapp_mb"]) for s in sampler.samples if s["serverapp_mb"]]
    superlink = [(s["t"], s["superlink_mb"]) for s in sampler.samples if s["superlink_mb"]]
    assert len(serverapp) >= 30, "too few samples of the ServerApp"
    growth = {
        name: growth_of(series)
        for name, series in (("serverapp", serverapp), ("superlink", superlink))
    }
    if path == "warm":
        # Each node from its first reply on: by then its executor holds what it keeps.
        for i in range(size):
            _, messages = parse_supernode_log(deployment.link.logs / f"supernode-{i}.log")
            replied = min(m.sent for m in messages if m.kind == "train" and m.sent is not None)
            series = [
                (s["t"], s["supernode_mb"][i]) for s in sampler.samples if s["wall"] >= replied
            ]
            assert len(series) >= 15, f"too few samples of node {i} after its first reply"
            growth[f"node-{i}"] = growth_of(series)

    settled = sampler.samples[len(sampler.samples) // 3 :]  # past start-up
    node_mb = [mb for s in settled for mb in s["supernode_mb"]]
    task_mb = [mb for s in settled for mb in s["clientapp_mb"]]
    per_node = {"median": round(statistics.median(node_mb), 1), "max": round(max(node_mb), 1)}
    per_task = {
        "median": round(statistics.median(task_mb), 1) if task_mb else None,
        "max": round(max(task_mb), 1) if task_mb else None,
    }
    report = {
        "path": path,
        "nodes": size,
        "minutes": minutes,
        "deployment_start_s": round(start_seconds, 1),
        # A SuperNode's own processes (flower-supernode and its SuperExec), once running,
        # and the ClientApp process it starts for each task.
        "supernode_mb": per_node,
        "clientapp_mb": per_task,
        "memory": growth,
        "peak_clientapps": max(len(s["clientapp_mb"]) for s in sampler.samples),
        "peak_total_mb": max(
            sum(s["supernode_mb"]) + sum(s["clientapp_mb"]) + (s["serverapp_mb"] or 0.0)
            for s in sampler.samples
        ),
        "counts": {
            "tasks": summary["tasks"],
            "arrivals": arrivals,
            "aggregations": summary["aggregations"],
            "aggregated_updates": aggregated,
            "discarded_at_end": discarded,
            "dropped_stale": stale,
            "rejected": rejected,
            "errors": summary["errors_total"],
            "in_flight_at_end": in_flight,
            "checkpoints": count("checkpoint"),
        },
        "final_accuracy": summary["final_accuracy"],
        "samples": sampler.samples,
    }
    (folder / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nsoak ({path}): {size} SuperNodes, {minutes:g} min, "
        f"{time.monotonic() - started:.0f} s in all; a SuperNode {per_node['median']:.0f} "
        f"MiB (+ {per_task['median'] or 0:.0f} MiB ClientApp per task); "
        f"ServerApp {growth['serverapp']['start_mb']:.0f} -> {growth['serverapp']['end_mb']:.0f} "
        f"MiB, SuperLink {growth['superlink']['start_mb']:.0f} -> "
        f"{growth['superlink']['end_mb']:.0f} MiB; {report['counts']}; "
        f"accuracy {summary['final_accuracy']:.3f}; report {folder / 'soak.json'}"
    )
    for name, numbers in growth.items():
        print(f"{name}: {numbers}")
    for name, numbers in growth.items():
        assert numbers["growth"] <= GROWTH_LIMIT, f"{name} memory keeps growing: {numbers}"
