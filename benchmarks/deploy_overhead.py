"""Where a deployed task's time goes: the stock ClientApp path against the warm executor.

Run ``python -m benchmarks.deploy_overhead`` (writes
``benchmarks/results/deploy_overhead.json`` and ``deploy_overhead.png``). The paths of
``--modes`` run in one invocation, one after the other, on the same machine: a real
``flower-superlink`` and real ``flower-supernode`` processes over loopback gRPC (TLS, node
authentication, :class:`fedsync.deploy.LocalDeployment`), the ``fedasync`` strategy on the
wall clock, the digits MLP, ``--tasks`` train tasks per path.

* ``stock``: every message runs the full ClientApp in the fresh ``flwr-clientapp``
  process Flower starts for it; Flower's defaults for its local polls.
* ``exec``: the warm executor (:class:`fedsync.deploy.warm.WarmLocalDeployment`), asking
  its SuperNode for ClientApp work every ``--exec-poll`` seconds, the SuperNode on
  Flower's own 3 s poll of the SuperLink (``fedsync-node --supernode-poll 0``; before
  the short poll was the default);
* ``exec-poll``: the same with the SuperNode's poll of the SuperLink at
  ``--supernode-poll`` seconds (:mod:`fedsync.deploy.fast_poll`);
* ``exec-default``: ``fedsync-node`` as it ships, no poll flag (its default,
  :data:`fedsync.deploy.node.DEFAULT_SUPERNODE_POLL`).

Each task's round trip (as the server measured it) is split with the SuperNodes'
timestamped logs (:mod:`fedsync.deploy.timing`) and the ClientApp's per-message timing
lines (node config ``timing-log``) into:

``poll_wait``
    dispatch to the SuperNode's pull: its ~3 s Fleet API poll and the server's pull lag;
``download``
    pulling the message's objects;
``exec_start``
    the SuperNode holds the message until ``flwr-clientapp`` runs (SuperExec poll, spawn);
``clientapp_boot``
    that process's Python start, Flower's imports (those the ClientApp module makes
    before :mod:`fedsync.clients.timing` starts its clock included) and task fetch;
``imports``
    the ClientApp module's load (fedsync, torch) as :mod:`fedsync.clients.timing` times
    it, by the first message of a process (zero for the warm executor's later tasks);
``data``, ``training``
    loading the partition; local training (the reply's ``compute-seconds``);
``encode``
    the rest of the handler: downlink decode, model build, uplink encode, serialization;
``reply_wait``
    handler end to the SuperNode sending (process exit, reply push, the SuperNode's
    0.5 s reply poll);
``upload``
    pushing the reply;
``server``
    the server's decode and aggregation, to its next dispatch to that node.

Overhead = round trip - training - download - upload (everything but training and the
bytes on the wire). The machine is shared and noisy: medians and min/max are reported.
``--device`` puts every node on a device (``cuda``: training, delta and codec there) and
``--run-config KEY=VALUE`` (alias ``--set``; ``flwr run``'s syntax) sets run-config keys on
top of the benchmark's (``server-device``, the codecs, ``seed``). With ``--soak S`` only the
``--soak-mode`` path runs, for ``S`` seconds, sampling every node's RSS (all processes of
its process group) to show it stays flat.

The JSON's ``provenance`` (:func:`fedsync.reports.provenance.provenance`) names the
command, commit, date and machine, with the load average at the start and, as
``load_average_end``, at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fedsync.compat.flower139 import parse_config_args
from fedsync.deploy import LocalDeployment
from fedsync.deploy.processes import read_timestamped_log
from fedsync.deploy.timing import parse_supernode_log
from fedsync.deploy.warm import WarmLocalDeployment
from fedsync.reports import read_events
from fedsync.reports.progress_bar import track
from fedsync.reports.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
MODES = ("stock", "exec", "exec-poll", "exec-default")
PHASES = (
    "poll_wait",
    "download",
    "exec_start",
    "clientapp_boot",
    "imports",
    "data",
    "training",
    "encode",
    "reply_wait",
    "upload",
    "server",
)
OVERHEAD_PHASES = tuple(p for p in PHASES if p not in ("training", "download", "upload"))


class RssSampler(threading.Thread):
    """Sum the RSS of every process in each SuperNode's process group, periodically."""

    def __init__(self, nodes: list[list[int]], every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            self.samples.append(
                {"t": round(time.monotonic() - self._t0, 1), "rss_mb": group_rss_mb(self.nodes)}
            )

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def group_rss_mb(nodes: list[list[int]]) -> list[float]:
    """Per node, RSS (MB) summed over the live processes of its process groups (/proc)."""
    totals = {pgid: 0.0 for groups in nodes for pgid in groups}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            pgid = int(fields[2])
            if pgid not in totals:
                continue
            rss_pages = int((entry / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        totals[pgid] += rss_pages * os.sysconf("SC_PAGE_SIZE") / 1e6
    return [round(sum(totals[p] for p in groups), 1) for groups in nodes]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_tasks(
    events_path: Path, supernode_logs: list[Path], timing_logs: list[Path]
) -> list[dict[str, Any]]:
    """Every arrived task's phases (seconds), joined from the three kinds of log."""
    events = list(read_events(events_path))
    dispatched: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event["event"] == "dispatch":
            dispatched.setdefault(int(event["node"]), []).append(event)
    arrivals = {str(e["task"]): e for e in events if e["event"] == "arrival"}
    rows: list[dict[str, Any]] = []
    for index, (log_path, timing_path) in enumerate(zip(supernode_logs, timing_logs, strict=True)):
        node_id, messages = parse_supernode_log(log_path)
        if node_id is None:
            continue
        trains = [m for m in messages if m.kind == "train"]
        lines = [t for t in _read_jsonl(timing_path) if t["message_type"] == "train"]
        node_dispatches = dispatched.get(node_id, [])
        for k, (dispatch, message, line) in enumerate(
            zip(node_dispatches, trains, lines, strict=False)
        ):
            arrival = arrivals.get(str(dispatch["task"]))
            if arrival is None or not message.complete:
                continue
            assert message.received is not None and message.sending is not None
            assert message.sent is not None
            round_trip = float(arrival["sim_duration"])
            busy = message.sent - message.receiving
            next_dispatch = node_dispatches[k + 1] if k + 1 < len(node_dispatches) else None
            handler = line["handler_end"] - line["handler_start"]
            imports = float(line.get("imports_s", 0.0))
            data = float(line.get("data_s", 0.0))
            training = float(line["compute_s"])
            # A warm executor's process predates the message: no start, no boot.
            process_start = max(float(line["process_start"]), message.received)
            phases = {
                "poll_wait": round_trip - busy,
                "download": message.received - message.receiving,
                "exec_start": process_start - message.received,
                "clientapp_boot": line["handler_start"] - process_start,
                "imports": imports,
                "data": data,
                "training": training,
                "encode": handler - imports - data - training,
                "reply_wait": message.sending - line["handler_end"],
                "upload": message.sent - message.sending,
                "server": (
                    float(next_dispatch["wall_time"]) - float(arrival["wall_time"])
                    if next_dispatch is not None
                    else None
                ),
            }
            overhead = round_trip - training - phases["download"] - phases["upload"]
            rows.append(
                {
                    "task": dispatch["task"],
                    "node_index": index,
                    "device": line.get("device", ""),
                    "device_class": line.get("device_class", ""),
                    "round_trip_s": round(round_trip, 3),
                    "overhead_s": round(overhead, 3),
                    **{
                        name: (round(value, 3) if value is not None else None)
                        for name, value in phases.items()
                    },
                }
            )
    return rows


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "mean": round(statistics.fmean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(rows: list[dict[str, Any]], skip_first: bool) -> dict[str, Any]:
    """Per-phase statistics (the first task per node left out when ``skip_first``)."""
    seen: set[int] = set()
    kept = []
    for row in rows:
        if skip_first and row["node_index"] not in seen:
            seen.add(row["node_index"])
            continue
        kept.append(row)
    summary: dict[str, Any] = {"tasks": len(kept)}
    if not kept:
        return summary
    for name in (*PHASES, "round_trip_s", "overhead_s"):
        values = [float(r[name]) for r in kept if r.get(name) is not None]
        if values:
            summary[name] = _stats(values)
    return summary


def run_path(
    mode: str,
    work: Path,
    *,
    nodes: int,
    tasks: int,
    exec_poll: float,
    supernode_poll: float = 0.2,
    wall_time: float = 0.0,
    device_classes: list[str] | None = None,
    device: str = "cpu",
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One deployment on a path of :data:`MODES`; its per-task rows and RSS samples.

    ``device`` is every node's (node config ``device``); ``settings`` are run-config
    keys set on top of this benchmark's (``server-device``, codecs, ``seed``).
    """
    folder = work / mode
    results = folder / "results"
    node_configs: list[dict[str, Any]] = []
    for i in range(nodes):
        config: dict[str, Any] = {
            "partition-id": i,
            "num-partitions": nodes,
            "device": device,
            "timing-log": str(folder / f"timing-{i}.jsonl"),
            "state-dir": str(folder / f"state-{i}"),
        }
        if device_classes:
            config["device-class"] = device_classes[i % len(device_classes)]
        node_configs.append(config)
    previous = os.environ.pop(EXEC_POLL_ENV, None)  # stock: Flower's SuperExec poll
    run_config: dict[str, Any] = {
        "strategy": "fedasync",
        "clock": "wall",
        "concurrency": nodes,
        "min-nodes": nodes,
        "local-epochs": 1,
        "max-aggregations": tasks,
        "max-tasks": tasks,
        "eval-every": 1000,
        "plots": False,
        "results-dir": str(results),
        "run-name": mode,
        **(settings or {}),
    }
    if wall_time > 0:
        run_config["max-aggregations"] = 100_000
        run_config["max-tasks"] = 0
        run_config["max-wall-time"] = wall_time
    deployment = (
        WarmLocalDeployment(
            folder / "run",
            node_configs,
            executor_poll=exec_poll,
            supernode_poll={"exec-poll": supernode_poll, "exec-default": None}.get(mode, 0.0),
        )
        if mode.startswith("exec")
        else LocalDeployment(folder / "run", node_configs)
    )
    started = time.monotonic()
    try:
        deployment.start()
        groups = [[p.pid] for p in deployment.supernodes]  # a warm node's executor included
        sampler = RssSampler(groups, every=2.0)
        sampler.start()
        try:
            outcome = deployment.run_app(ROOT, run_config, timeout=max(1800.0, wall_time + 600.0))
            assert deployment.link.process is not None
            superlink_cpu = process_cpu_s(deployment.link.process.pid)
        finally:
            sampler.stop()
    finally:
        deployment.stop()
        if previous is None:
            os.environ.pop(EXEC_POLL_ENV, None)
        else:
            os.environ[EXEC_POLL_ENV] = previous
    elapsed = time.monotonic() - started
    if not outcome.completed:
        raise RuntimeError(f"{mode}: run ended {outcome.status}: {outcome.details}")
    logs = [deployment.link.logs / f"supernode-{i}.log" for i in range(nodes)]
    rows = split_tasks(
        results / mode / "events.jsonl", logs, [folder / f"timing-{i}.jsonl" for i in range(nodes)]
    )
    restarts = sum(
        1
        for i in range(nodes)
        for _, line in read_timestamped_log(logs[i])
        if "warm executor exited" in line
    )
    return {
        "mode": mode,
        "wall_s": round(elapsed, 1),
        "superlink_cpu_s": round(superlink_cpu, 2),
        "node_configs": node_configs,
        "executor_restarts": restarts,
        "tasks": rows,
        "rss_mb": sampler.samples,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """A stacked bar per path: the median of each phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if m in result["summary"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottoms = [0.0] * len(modes)
    colors = [plt.get_cmap("tab20")(k) for k in range(20)]
    for k, phase in enumerate(PHASES):
        heights = [result["summary"][m]["steady"].get(phase, {}).get("median", 0.0) for m in modes]
        heights = [max(h, 0.0) for h in heights]
        ax.bar(modes, heights, bottom=bottoms, label=phase, color=colors[k % len(colors)])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("seconds per task (median of each phase)")
    ax.set_title("Deployed task time by phase, loopback, after each node's first task")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=12, help="train tasks per path")
    parser.add_argument("--exec-poll", type=float, default=0.05)
    parser.add_argument("--supernode-poll", type=float, default=0.2, help="exec-poll mode")
    parser.add_argument("--modes", default="stock,exec", help=f"of {', '.join(MODES)}")
    parser.add_argument("--soak", type=float, default=0.0, help="one path only, seconds")
    parser.add_argument("--soak-mode", default="exec", choices=MODES)
    parser.add_argument("--device-classes", default="laptop-x86,jetson-orin")
    parser.add_argument("--device", default="cpu", help="every node's device (cpu, cuda)")
    parser.add_argument(
        "--run-config",
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run-config keys on top of the benchmark's, in flwr run's syntax "
        '(TOML values), e.g. server-device="cuda"',
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "deploy_overhead.json")
    args = parser.parse_args(argv)
    settings = parse_config_args(args.run_config)
    classes = [c for c in args.device_classes.split(",") if c]
    modes = [args.soak_mode] if args.soak > 0 else args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown --modes {', '.join(unknown)}; choose from {', '.join(MODES)}")
    result: dict[str, Any] = {
        "benchmark": "deploy_overhead",
        "provenance": provenance("python -m benchmarks.deploy_overhead", argv),
        "nodes": args.nodes,
        "device": args.device,
        "settings": settings,
        "exec_poll_s": args.exec_poll,
        "runs": {},
        "summary": {},
    }
    with tempfile.TemporaryDirectory(prefix="deploy-overhead-") as tmp:
        for mode in track(modes, "deployment paths"):
            run = run_path(
                mode,
                Path(tmp),
                nodes=args.nodes,
                tasks=args.tasks,
                exec_poll=args.exec_poll,
                supernode_poll=args.supernode_poll,
                wall_time=args.soak,
                device_classes=classes,
                device=args.device,
                settings=settings,
            )
            result["runs"][mode] = run
            result["summary"][mode] = {
                "all": summarize(run["tasks"], skip_first=False),
                "steady": summarize(run["tasks"], skip_first=True),
                "executor_restarts": run["executor_restarts"],
            }
            print(mode, json.dumps(result["summary"][mode]["steady"], indent=1), flush=True)
    result["provenance"]["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    # Against the first path of the run (stock, or the warm executor on Flower's poll).
    base_mode = next(iter(result["summary"]), None)
    if base_mode is not None and len(result["summary"]) > 1:
        base = result["summary"][base_mode]["steady"]
        result["ratios"] = {
            f"{base_mode}/{mode}": {
                name: round(base[name]["median"] / other[name]["median"], 2)
                for name in ("round_trip_s", "overhead_s")
                if name in base and name in other and other[name]["median"] > 0
            }
            for mode in result["summary"]
            if mode != base_mode and (other := result["summary"][mode]["steady"])
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.soak <= 0:
        plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
