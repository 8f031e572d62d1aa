"""How link-bound a fleet was in a run: upload time against compute time per task.

::

    python -m fedsync.simulations.linkbound runs/compare/<run>/results/fedbuff/events.jsonl \\
        --json simulations/results/fmnist-iot/link-ratio.json

Reads an asynchronous run's ``events.jsonl``: its run configuration (``run_start``:
fleet, local epochs, step cap, batch size), which fleet profile each device had
(``async_start``) and every update that arrived (``arrival``: the device, the real
length of its payload, the examples in its partition). For each device it computes, with
the fleet's own profile (:class:`~fedsync.clock.profiles.DeviceProfile`), the simulated
compute seconds of one task and the seconds its uplink took for the payloads it really
sent (their median), and reports the ratio upload / compute per device, per group, and
for the median device by compute time. Run on a dense-uplink run (FedBuff), the upload
is the dense float32 update.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedsync.clock import load_fleet
from fedsync.clock.profiles import DeviceProfile
from fedsync.reports import read_events

__all__ = ["DeviceLoad", "bytes_by_kind", "device_loads", "main", "summarize"]


@dataclass(frozen=True)
class DeviceLoad:
    """One device's task in a run: what it computed and what its upload took."""

    device: int
    group: str
    examples: int
    compute_s: float
    upload_bytes: int
    upload_s: float

    @property
    def ratio(self) -> float:
        """Upload seconds per compute second."""
        return self.upload_s / self.compute_s if self.compute_s > 0 else math.inf


def _task_work(examples: int, training: Mapping[str, Any]) -> tuple[int, int]:
    """Samples and optimizer steps of one task on ``examples`` examples (the training
    loop: ``epochs`` passes of ``ceil(examples / batch)`` steps, capped at ``local-steps``)."""
    epochs = int(training.get("local-epochs", 1))
    batch = int(training.get("batch-size", 32))
    cap = int(training.get("local-steps", 0))
    steps = epochs * math.ceil(examples / batch)
    if cap > 0:
        steps = min(steps, cap)
    samples = min(examples * epochs, steps * batch)
    return samples, steps


def device_loads(events_path: Path) -> list[DeviceLoad]:
    """Per device that sent at least one update: its task's compute and upload time.

    Raises
    ------
    ValueError
        If the log has no ``run_start`` or ``async_start`` event (not an asynchronous
        run's log), or a profile name is not in the run's fleet.
    """
    starts = list(read_events(events_path, "run_start"))
    layouts = list(read_events(events_path, "async_start"))
    if not starts or not layouts:
        raise ValueError(f"{events_path}: not an asynchronous run's event log")
    training = starts[0].get("run_config", {})
    fleet = load_fleet(str(layouts[0]["fleet"]))
    profiles: dict[str, DeviceProfile] = {p.name: p for p, _ in fleet.groups}
    names = [str(name) for name in layouts[0]["profiles"]]
    unknown = sorted(set(names) - set(profiles))
    if unknown:
        raise ValueError(f"{events_path}: profiles {unknown} are not in fleet {fleet.name!r}")
    sent: dict[int, list[int]] = {}
    examples: dict[int, int] = {}
    for arrival in read_events(events_path, "arrival"):
        device = int(arrival["device"])
        sent.setdefault(device, []).append(int(arrival["bytes_up"]))
        examples[device] = int(arrival["num_examples"])
    loads = []
    for device in sorted(sent):
        profile = profiles[names[device]]
        samples, steps = _task_work(examples[device], training)
        upload = int(statistics.median(sent[device]))
        loads.append(
            DeviceLoad(
                device=device,
                group=names[device],
                examples=examples[device],
                compute_s=profile.compute_seconds(samples, steps),
                upload_bytes=upload,
                upload_s=profile.uplink_seconds(upload),
            )
        )
    return loads


def summarize(loads: Sequence[DeviceLoad]) -> dict[str, Any]:
    """The median device by compute time, each group's median ratio, and every device.

    Raises
    ------
    ValueError
        If ``loads`` is empty.
    """
    if not loads:
        raise ValueError("no device sent an update")
    by_compute = sorted(loads, key=lambda d: (d.compute_s, d.device))
    median = by_compute[(len(by_compute) - 1) // 2]
    groups: dict[str, list[DeviceLoad]] = {}
    for load in loads:
        groups.setdefault(load.group, []).append(load)
    return {
        "devices": len(loads),
        "median_device": {**asdict(median), "ratio": median.ratio},
        "median_ratio_over_devices": statistics.median(d.ratio for d in loads),
        "share_of_devices_at_least_3x": sum(d.ratio >= 3.0 for d in loads) / len(loads),
        "groups": {
            name: {
                "devices": len(members),
                "median_compute_s": statistics.median(d.compute_s for d in members),
                "median_upload_s": statistics.median(d.upload_s for d in members),
                "median_ratio": statistics.median(d.ratio for d in members),
            }
            for name, members in groups.items()
        },
        "per_device": [{**asdict(d), "ratio": d.ratio} for d in loads],
    }


def bytes_by_kind(events_path: Path, until: float = math.inf) -> dict[str, Any]:
    """Where a run's bytes went up to simulated time ``until``: tasks dispatched and
    bytes sent down per downlink kind (``full``: a whole model; ``delta``), the devices
    that got at least one task, and the bytes of the updates that arrived."""
    down: dict[str, dict[str, int]] = {}
    devices: set[int] = set()
    for task in read_events(events_path, "dispatch"):
        if float(task["sim_time"]) > until:
            continue
        kind = down.setdefault(str(task.get("downlink_kind", "full")), {"tasks": 0, "bytes": 0})
        kind["tasks"] += 1
        kind["bytes"] += int(task["bytes_down"])
        devices.add(int(task["device"]))
    arrivals = [a for a in read_events(events_path, "arrival") if float(a["sim_time"]) <= until]
    return {
        "until_sim_time": until,
        "downlink": down,
        "devices_reached": len(devices),
        "updates": len(arrivals),
        "uplink_bytes": sum(int(a["bytes_up"]) for a in arrivals),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedsync.simulations.linkbound EVENTS [--json OUT] [--until T]``; returns the
    exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.simulations.linkbound",
        description="Upload time against compute time per task, from an asynchronous run.",
    )
    parser.add_argument("events", help="an asynchronous run's events.jsonl")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument(
        "--until",
        type=float,
        default=math.inf,
        help="also count the bytes each way up to this simulated time (the time to target)",
    )
    args = parser.parse_args(argv)
    try:
        summary = summarize(device_loads(Path(args.events)))
        summary["bytes_by_kind"] = bytes_by_kind(Path(args.events), args.until)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    median = summary["median_device"]
    print(
        f"median device (by compute time): #{median['device']} ({median['group']}, "
        f"{median['examples']} examples): compute {median['compute_s']:.2f} s, upload "
        f"{median['upload_bytes']} B in {median['upload_s']:.2f} s = {median['ratio']:.2f}x"
    )
    over, share = summary["median_ratio_over_devices"], summary["share_of_devices_at_least_3x"]
    print(
        f"median ratio over {summary['devices']} devices {over:.2f}x; "
        f"{100 * share:.0f} % of devices at >= 3x"
    )
    for name, group in summary["groups"].items():
        print(
            f"  {name}: {group['devices']} devices, compute {group['median_compute_s']:.2f} s, "
            f"upload {group['median_upload_s']:.2f} s, ratio {group['median_ratio']:.2f}x"
        )
    spent = summary["bytes_by_kind"]
    print(
        f"to simulated time {spent['until_sim_time']}: {spent['updates']} updates, "
        f"{spent['uplink_bytes']} B up; {spent['devices_reached']} devices reached; down: "
        + ", ".join(f"{k} {v['tasks']} tasks {v['bytes']} B" for k, v in spent["downlink"].items())
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
