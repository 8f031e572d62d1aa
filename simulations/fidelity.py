"""Simulated vs deployed: does the virtual clock predict a run over real, shaped links?

``python -m fedsync.simulations.fidelity`` (root: it builds network namespaces) runs the
scenario ``links-fidelity`` (``simulations/scenarios/links-fidelity.toml``, read by
:func:`fedsync.simulations.scenario.load_scenario`: three devices whose links, from the fleet
``links-fidelity``, are 1, 5 and 20 Mbit/s) five times:

1. **calibration** -- deployed (TLS, node auth, one namespace per SuperNode) on
   *unshaped* links: the measured ClientApp compute seconds give the compute speed,
   and the per-task time that is neither compute nor transfer gives Flower's overhead;
2. **measured** -- deployed again, each link shaped (``tbf``) to its fleet rate;
3. **simulated** -- Flower's simulation engine with the virtual clock and the fleet's
   link rates with the calibrated compute speed (what the simulator models);
4. **simulated-overhead** -- the same with the calibration run's per-task overhead as
   the devices' ``latency`` (what the simulator *could* model once told);
5. **simulated-overhead-in-sample** -- the same with the overhead of run 2 itself (its
   modelled transfer times taken out): not a prediction, a check of the virtual clock's
   event model given the per-task times the machine really had.

``--nodes warm`` deploys warm nodes (``fedsync-node`` in each namespace: a SuperNode
and a long-lived executor, no process start per task) instead of Flower's stock
SuperNodes; ``--supernode-poll S`` (warm nodes only) shortens the SuperNodes' fixed 3 s
poll for work. Both deployed runs (calibration and measured) use the same nodes. With
``--scenario links-fidelity-dense`` (dense 1.2 MB payloads on 1, 2 and 5 Mbit/s) the
transfers are most of a task's time.

Compute speed of the simulated fleets is the ClientApp's own training seconds per
sample in the unshaped calibration run (its ``compute-seconds``, timed around local
training only): a property of the device, what a fleet declaration states. Variant 3
uses it alone; the per-task *overhead* (everything in a round trip that is neither
training nor transfer: polling, process start, executor hand-off) enters only variants
4 and 5.

and writes ``fidelity.json`` (time to the target accuracy, to the version at which the
measured run met it and to the last aggregation, per-node task times, the overheads
measured, the machine's load, why the numbers differ), the calibrated fleet files and
both runs' ``links.json`` into ``--out`` (default ``simulations/results/<scenario>``).
The calibration run never sees the shaped links: variants 3 and 4 predict run 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsync.compat.flower139 import LOCAL_PULL_RETRY_CAP_S
from fedsync.deploy.links import NODE_KINDS, LinkRun, run_over_links
from fedsync.deploy.local import LocalSuperLink
from fedsync.deploy.netns import LinkShape, netns_unavailable_reason
from fedsync.deploy.timing import TaskTiming
from fedsync.reports import read_events
from fedsync.simulations.fidelity_setup import Calibration, FidelitySetup, modelled_transfer_s
from fedsync.simulations.results import evaluation_entries
from fedsync.simulations.scenario import PROJECT_ROOT, ScenarioError, load_scenario

__all__ = ["DEFAULT_SCENARIO", "RESULTS", "main", "run_fidelity"]

DEFAULT_SCENARIO = "links-fidelity"
"""The scenario run by default (a name in ``simulations/scenarios``, or a path)."""

RESULTS = PROJECT_ROOT / "simulations" / "results"
"""``--out`` defaults to ``RESULTS / <scenario name>``."""


def run_fidelity(
    setup: FidelitySetup,
    out: Path,
    *,
    workdir: Path,
    app_dir: Path = PROJECT_ROOT,
    nodes: str = "stock",
    supernode_poll: float = 0.0,
) -> dict[str, Any]:
    """Run the five runs (module docstring) and write ``fidelity.json`` into ``out``.

    ``nodes`` and ``supernode_poll`` choose the deployed nodes
    (:func:`fedsync.deploy.links.run_over_links`).
    """
    out.mkdir(parents=True, exist_ok=True)
    count = len(setup.fleet)
    deployed_config = {**setup.run_config, "target-accuracy": setup.target}
    started = time.monotonic()

    loads: dict[str, list[float]] = {}
    loads["calibration"] = _load()
    calibration_run = run_over_links(
        workdir / "calibration",
        app_dir,
        {**deployed_config, "run-name": "calibration"},
        [None] * count,
        timeout=setup.timeout,
        nodes=nodes,
        supernode_poll=supernode_poll,
    )
    _require_completed("calibration", calibration_run)
    calibration = Calibration.from_timings(calibration_run.timings, setup.epochs)

    loads["measured"] = _load()
    measured_run = run_over_links(
        workdir / "measured", app_dir, {**deployed_config, "run-name": "measured"},
        setup.shapes, timeout=setup.timeout, nodes=nodes, supernode_poll=supernode_poll,
    )  # fmt: skip
    _require_completed("measured", measured_run)
    loads["end"] = _load()
    # In-sample: the overhead of the measured run itself (its modelled transfers taken
    # out). Not a prediction -- a check of the virtual clock's event model given the
    # per-task times this machine really had during that run.
    in_sample = Calibration.from_timings(measured_run.timings, setup.epochs, setup.shapes)

    variants = {
        "simulated": (calibration, False, "the unshaped calibration run"),
        "simulated-overhead": (calibration, True, "the unshaped calibration run"),
        "simulated-overhead-in-sample": (in_sample, True, "the measured (shaped) run itself"),
    }
    fleets = {}
    for label, (source, overhead, where) in variants.items():
        path = out / f"fleet-{label}.toml"
        path.write_text(
            source.fleet_toml(
                f"{setup.name}-{label}", setup.shapes, overhead=overhead, source=where
            )
        )
        fleets[label] = path
    simulated = _simulate(setup, fleets, workdir / "simulation", app_dir)

    measured = _run_numbers(measured_run.results, clock="wall")
    report: dict[str, Any] = {
        "scenario": setup.name,
        "machine": _machine(),
        "load_average_1min_before": loads,
        "nodes": nodes,
        # 0: Flower's own poll (a SuperNode asks for work every 3 s).
        "supernode_poll_s": supernode_poll,
        "target_accuracy": setup.target,
        "links": [s.describe() for s in setup.shapes],
        "run_config": setup.run_config,
        "calibration": {
            **calibration.as_dict(),
            "on": "the same deployment on unshaped links (separate run, before the shaped one)",
            **_overheads(calibration_run),
        },
        "calibration_in_sample": {
            **in_sample.as_dict(),
            "on": "the measured run itself, modelled transfer times taken out",
        },
        "measured": {**measured, **_overheads(measured_run, setup.shapes)},
        "simulated": {
            label: {
                "fleet": fleets[label].name,
                "calibrated_on": variants[label][2],
                **numbers,
                **_ratios(numbers, measured),
            }
            for label, numbers in simulated.items()
        },
        "fab_bytes": measured_run.report.get("fab_bytes"),
        "first_message_download_s": [
            (link.get("first_message") or {}).get("download_s")
            for link in measured_run.report["links"]
        ],
        "elapsed_s": round(time.monotonic() - started, 1),
        "why_they_differ": _explanations(nodes, supernode_poll),
        "limits": [
            "links are rate-limited with tbf both ways; this kernel has no netem (and no fq, "
            "police or gact), so there is no link delay, jitter or loss to compare",
            "one run each: asynchronous arrival order differs between runs, so "
            "time-to-target carries run-to-run noise of about one aggregation",
            "the machine is shared: other jobs' CPU load (load_average_1min_before) stretches "
            "process start-up and compute between the calibration and the measured run",
        ],
    }
    (out / "fidelity.json").write_text(json.dumps(report, indent=2) + "\n")
    for label, run in (("calibration", calibration_run), ("measured", measured_run)):
        (out / f"links-{label}.json").write_text(json.dumps(run.report, indent=2) + "\n")
    return report


def _simulate(
    setup: FidelitySetup, fleets: Mapping[str, Path], workdir: Path, app_dir: Path
) -> dict[str, dict[str, Any]]:
    link = LocalSuperLink(workdir / "superlink", simulation=True)
    numbers: dict[str, dict[str, Any]] = {}
    link.start()
    try:
        for label, fleet in fleets.items():
            config = {
                **setup.run_config,
                "clock": "virtual",
                "fleet": str(fleet),
                "target-accuracy": setup.target,
                "results-dir": str((workdir / "results").resolve()),
                "run-name": label,
            }
            outcome = link.run_app(
                app_dir, config, federation_config=setup.federation, timeout=setup.timeout
            )
            if not outcome.completed:
                raise RuntimeError(f"simulation {label}: {outcome.status} {outcome.details}")
            numbers[label] = _run_numbers(workdir / "results" / label, clock="virtual")
    finally:
        link.stop()
    return numbers


def _run_numbers(results: Path, *, clock: str) -> dict[str, Any]:
    """Time to target and to the last aggregation, per-device round trips, from a run."""
    summary = json.loads((results / "summary.json").read_text())
    events = list(read_events(results / "events.jsonl"))
    aggregations = [e for e in events if e["event"] == "aggregation"]
    round_trips: dict[int, list[float]] = {}
    for event in events:
        if event["event"] == "arrival":
            round_trips.setdefault(int(event["device"]), []).append(float(event["sim_duration"]))
    target = summary.get("target", {})
    return {
        "clock": clock,
        "time_to_target_s": target.get("sim_time") if target.get("reached") else None,
        "version_at_target": target.get("version") if target.get("reached") else None,
        "time_to_last_aggregation_s": aggregations[-1]["sim_time"] if aggregations else None,
        "aggregations": summary.get("aggregations"),
        "final_accuracy": summary.get("final_accuracy"),
        "mean_round_trip_s_by_device": {
            str(device): round(statistics.fmean(values), 3)
            for device, values in sorted(round_trips.items())
        },
        "accuracy_by_version": [
            [e["version"], round(float(e["accuracy"]), 4), e["sim_time"]]
            for e in evaluation_entries(summary)
        ],
    }


def _overheads(run: LinkRun, shapes: Sequence[LinkShape | None] = ()) -> dict[str, Any]:
    """Mean per-task phases of a deployed run (seconds), over all tasks and per node.

    ``compute_first_task`` / ``compute_later_tasks`` split the training seconds at each
    node's first task (a fresh process's torch warm-up); ``modelled_transfer`` is what
    the virtual clock charges for the task's payloads on ``shapes`` (``bytes * 8 /
    rate``), next to the measured ``download + upload``.
    """
    timings = run.timings
    if not timings:
        return {}

    def mean(values: Sequence[float]) -> float | None:
        return round(statistics.fmean(values), 3) if values else None

    def phases(rows: Sequence[TaskTiming]) -> dict[str, Any]:
        seen: set[int] = set()
        first: list[float] = []
        later: list[float] = []
        for t in rows:  # each node's tasks in dispatch order
            (later if t.node_index in seen else first).append(t.compute_s)
            seen.add(t.node_index)
        return {
            "round_trip": mean([t.round_trip_s for t in rows]),
            "outside_polling_and_pull": mean([t.outside_s for t in rows]),
            "poll_wait": mean([t.poll_wait_s for t in rows if t.poll_wait_s is not None]),
            "server_pull_lag": mean([t.pull_lag_s for t in rows if t.pull_lag_s is not None]),
            "download": mean([t.download_s for t in rows]),
            "clientapp_total": mean([t.clientapp_s for t in rows]),
            "clientapp_compute": mean([t.compute_s for t in rows]),
            "compute_first_task": mean(first),
            "compute_later_tasks": mean(later),
            "clientapp_start_imports_data": mean([t.clientapp_overhead_s for t in rows]),
            "upload": mean([t.upload_s for t in rows]),
            "modelled_transfer": mean([modelled_transfer_s(t, shapes) for t in rows]),
        }

    nodes = sorted({t.node_index for t in timings})
    return {
        "per_task_mean_s": phases(timings),
        "per_node_mean_s": {
            str(node): phases([t for t in timings if t.node_index == node]) for node in nodes
        },
        "tasks": len(timings),
    }


def _ratios(simulated: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    """Simulated / measured times; also at the version where the *measured* run met the
    target, which takes the learning trajectory (arrival order) out of the comparison."""
    version = measured.get("version_at_target")
    at_version = {
        "time_to_measured_target_version_s": _time_at_version(simulated, version),
        "measured_target_version": version,
    }
    ratios: dict[str, Any] = {**at_version}
    pairs = {
        "time_to_target_ratio": (
            simulated.get("time_to_target_s"),
            measured.get("time_to_target_s"),
        ),
        "time_to_last_aggregation_ratio": (
            simulated.get("time_to_last_aggregation_s"),
            measured.get("time_to_last_aggregation_s"),
        ),
        "time_to_measured_target_version_ratio": (
            at_version["time_to_measured_target_version_s"],
            measured.get("time_to_target_s"),
        ),
    }
    for key, (sim, real) in pairs.items():
        ratios[key] = round(sim / real, 3) if sim is not None and real else None
    return ratios


def _time_at_version(numbers: Mapping[str, Any], version: int | None) -> float | None:
    """Clock time of the first evaluation at ``version`` (every version is evaluated)."""
    if version is None:
        return None
    for evaluated, _, at in numbers.get("accuracy_by_version", []):
        if evaluated == version:
            return float(at)
    return None


def _explanations(nodes: str, supernode_poll: float) -> list[str]:
    if nodes == "warm":
        runtime = (
            "warm nodes: each node's executor runs every task in one long-lived process "
            "(imports and the app loaded during the probe, the data on the first task), so "
            "no process starts per task; what is left is the hand-off between SuperNode and "
            "executor over the node's loopback (clientapp_start_imports_data) and the first "
            "task's torch warm-up (in clientapp_compute)"
        )
    else:
        runtime = (
            "Flower 1.39 starts a fresh flwr-clientapp process for every message: Python, "
            "torch, flwr and the app are imported, the data set is loaded and partitioned, "
            "and the first training step pays torch's warm-up -- seconds per task on 2 "
            "shared cores (clientapp_start_imports_data, compute_cold_start_s); the "
            "simulation engine keeps warm Ray actors and the virtual clock counts only the "
            "fleet's compute speed"
        )
    poll = (
        f"an idle SuperNode asks for work every {supernode_poll:g} s (fedsync-node "
        f"--supernode-poll) and checks for the ClientApp's reply as often"
        if supernode_poll > 0
        else "an idle SuperNode asks for work every ~3 s (Flower's fixed poll; after a reply "
        "it sleeps those 3 s before its next ask) and waits 0.5 s between checks for the "
        "ClientApp's reply"
    )
    return [
        runtime,
        f"{poll} (poll_wait, part of outside_polling_and_pull); the virtual clock has no polling",
        "the server takes a reply late (server_pull_lag, the rest of "
        "outside_polling_and_pull): Flower announces a reply while its node is still "
        "uploading it, and the ServerApp pulls its objects until they are all in, retrying "
        f"from its poll interval, at most {LOCAL_PULL_RETRY_CAP_S:g} s apart "
        "(fedsync.compat.flower139); replies are "
        "pulled concurrently (fedsync.serverapp.reply_pulls), so no reply waits behind another's "
        "upload. The virtual clock takes every reply the moment its upload ends",
        "the ClientApps and the server share 2 CPU cores, so measured compute and "
        "start-up stretch when tasks overlap; the fleet has one speed per device",
        "every node first downloads the app bundle (fab_bytes) over its link: with the "
        "probe before the clock starts it does not count toward time-to-target, but on the "
        "1 Mbit/s link it delays the run's start (first_message_download_s)",
        "transfers: the virtual clock charges the payload bytes over the link rate; the "
        "wire also carries TLS, HTTP/2, gRPC and TCP/IP headers (a few %), the requests "
        "around each message, and the SuperNode's polls on the same shaped link",
    ]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _machine() -> dict[str, Any]:
    import flwr  # late: the report only

    return {
        "cpus": os.cpu_count(),
        # Other work on the machine stretches every measured time; say how busy it was.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "flwr": getattr(flwr, "__version__", "?"),
    }


def _require_completed(label: str, run: LinkRun) -> None:
    if not run.outcome.completed:
        raise RuntimeError(
            f"{label} deployment: {run.outcome.status} {run.outcome.details}\n"
            f"{run.outcome.output[-2000:]}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.simulations.fidelity", description=__doc__
    )
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help="scenario name or .toml path")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default simulations/results/<scenario>)",
    )
    parser.add_argument(
        "--nodes",
        choices=NODE_KINDS,
        default="stock",
        help="stock: Flower's SuperNodes (a process per task); warm: fedsync-node",
    )
    parser.add_argument(
        "--supernode-poll",
        type=float,
        default=0.0,
        help="warm nodes: seconds between a SuperNode's asks for work (0: Flower's 3 s)",
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="run folders (default runs/fidelity-<time>)"
    )
    args = parser.parse_args(argv)
    if not args.supernode_poll >= 0.0:
        parser.error(f"--supernode-poll must be >= 0, got {args.supernode_poll}")
    if args.supernode_poll > 0.0 and args.nodes != "warm":
        parser.error("--supernode-poll needs --nodes warm (stock SuperNodes poll every 3 s)")
    try:
        setup = FidelitySetup.from_scenario(load_scenario(args.scenario))
    except ScenarioError as err:
        print(f"fidelity: {err}", file=sys.stderr)
        return 2
    reason = netns_unavailable_reason()
    if reason:
        print(f"cannot build shaped links here: {reason}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path("runs") / time.strftime("fidelity-%Y%m%d-%H%M%S")
    out = args.out or RESULTS / setup.name
    report = run_fidelity(
        setup,
        out,
        workdir=workdir.resolve(),
        nodes=args.nodes,
        supernode_poll=args.supernode_poll,
    )
    print(json.dumps({k: report[k] for k in ("measured", "simulated")}, indent=2))
    print(f"written: {out / 'fidelity.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
