"""Bytes per update of pruned runs, read from what the runs wrote.

::

    python -m fedsync.simulations.pruned_bytes <run-dir>/results --out bytes_per_update.json

For each run folder under the results folder (``events.jsonl`` and ``summary.json``, as
``python -m fedsync.simulations.compare`` leaves them): the uplink bytes of every update (the
real payload lengths the server received) before and after the cut (updates coded
against the masks: their task's ``uplink_codec`` is ``mask:digest=...``), the downlink
bytes per task (model payload plus any mask frame), the mask frames sent, the final
accuracy, and each run's bytes per update after the cut over the first run without a cut
(the dense baseline).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsync.reports import read_events

__all__ = ["main", "run_bytes"]


def _stats(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def run_bytes(folder: Path) -> dict[str, Any]:
    """The byte counts and accuracy of one run folder."""
    events = folder / "events.jsonl"
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    dispatches = {e["task"]: e for e in read_events(events, "dispatch")}
    arrivals = list(read_events(events, "arrival"))
    prunes = list(read_events(events, "prune"))
    after = [a for a in arrivals if dispatches[a["task"]]["uplink_codec"].startswith("mask:")]
    before = [a for a in arrivals if a not in after]
    tasks = list(dispatches.values())
    return {
        "final_accuracy": summary.get("final_accuracy"),
        "aggregations": summary.get("aggregations", summary.get("version")),
        "prune": prunes[0] if prunes else None,
        "uplink_bytes_per_update": {
            "before_cut": _stats([a["bytes_up"] for a in before]),
            "after_cut": _stats([a["bytes_up"] for a in after]),
        },
        "downlink_bytes_per_task": _stats([t["bytes_down"] for t in tasks]),
        "mask_frames_sent": sum(1 for t in tasks if t.get("mask_bytes", 0) > 0),
        "mask_bytes_total": sum(t.get("mask_bytes", 0) for t in tasks),
        "total_bytes_up": summary.get("total_bytes_up"),
        "total_bytes_down": summary.get("total_bytes_down"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the JSON for every run folder under the results folder."""
    parser = argparse.ArgumentParser(prog="python -m fedsync.simulations.pruned_bytes")
    parser.add_argument("results", type=Path, help="folder holding one folder per run")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    runs = {
        folder.name: run_bytes(folder)
        for folder in sorted(args.results.iterdir())
        if (folder / "events.jsonl").exists() and (folder / "summary.json").exists()
    }
    dense = next((r for r in runs.values() if r["prune"] is None), None)
    if dense is not None:
        base = dense["uplink_bytes_per_update"]["before_cut"]
        for run in runs.values():
            after = run["uplink_bytes_per_update"]["after_cut"]
            if after is not None and base is not None:
                run["uplink_after_cut_over_dense"] = after["mean"] / base["mean"]
            if run["final_accuracy"] is not None and dense["final_accuracy"] is not None:
                run["accuracy_minus_dense"] = run["final_accuracy"] - dense["final_accuracy"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name, run in runs.items():
        after = (
            run["uplink_bytes_per_update"]["after_cut"]
            or run["uplink_bytes_per_update"]["before_cut"]
        )
        print(
            f"{name}: final accuracy {run['final_accuracy']}, "
            f"uplink {after['mean'] if after else 0:.0f} B/update"
            + (f" after the cut at v{run['prune']['version']}" if run["prune"] else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
