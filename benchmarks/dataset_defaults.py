"""Which local-training defaults make each bundled dataset learn: the measurement behind
the dataset registry's :class:`~fedsync.data.registry.LocalTraining` table.

Every run is the real Flower app on Flower's simulation engine, started as ``fedsync
run`` starts it (one local SuperLink for all runs, stopped by process id at the end),
with the app's quickstart settings: 10 simulated devices, the app's defaults for
everything but the dataset and the candidate's ``learning-rate`` and ``local-epochs``.
fedsync's TEASQ mode runs ``--aggregations`` aggregations with a central evaluation
every ``--eval-every``; Flower's FedAvg runs ``--rounds`` rounds with the candidate the
registry holds now (``learning-rate = 0`` and ``local-epochs = 0``, i.e. ``auto``).
Each run's evaluations and its health verdict (:mod:`fedsync.aggregation.health`) go to
the JSON, each with the command, the commit, the machine's load and the seed. Runs of
the datasets measured replace those datasets' runs already in ``--out``; the others
stay (datasets can be measured one invocation at a time)::

    python -m benchmarks.dataset_defaults --data-dir ../shared/data \\
        --out benchmarks/results/dataset_defaults.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedsync.aggregation.health import health_problem
from fedsync.config import RunConfig
from fedsync.reports import RunSummary

PROJECT_ROOT = Path(__file__).resolve().parents[1]

CANDIDATES: dict[str, list[tuple[float, int]]] = {
    "digits": [(0.1, 3)],
    "mnist": [(0.1, 3), (0.05, 1), (0.01, 1)],
    "fashion-mnist": [(0.1, 3), (0.1, 1), (0.05, 1), (0.01, 1)],
    "shakespeare": [(0.1, 1), (0.5, 1), (1.0, 1)],
    "synthetic": [(0.1, 3), (0.1, 1), (0.01, 1)],
}
"""Per dataset, the (learning-rate, local-epochs) pairs tried; (0.1, 3) was the app's
default for every dataset before the table."""


def run_one(link: Any, values: dict[str, Any], results: Path, name: str) -> dict[str, Any]:
    """One run of the app; its evaluations, health, status and wall time."""
    started = time.monotonic()
    outcome = link.run_app(
        PROJECT_ROOT,
        {**values, "results-dir": str(results), "run-name": name},
        federation_config={"num-supernodes": 10, "client-resources-num-cpus": 1},
        timeout=1800.0,
    )
    wall = time.monotonic() - started
    summary = RunSummary.read(results / name / "summary.json")
    settings = RunConfig.from_run_config(values).training
    evaluations = [
        {"version": e["version"], "accuracy": e["accuracy"], "loss": e["loss"]}
        for e in summary.get("evaluations", [])
    ]
    return {
        "name": name,
        "run_config": values,
        "resolved": {
            "model": settings.model,
            "learning-rate": settings.learning_rate,
            "local-epochs": settings.local_epochs,
            "partitioning": settings.partitioning,
        },
        "status": outcome.status,
        "wall_seconds": round(wall, 1),
        "final_accuracy": summary.get("final_accuracy"),
        "best_accuracy": summary.get("best_accuracy"),
        "final_loss": summary.get("final_loss"),
        "health": (summary.get("health") or {}).get("status"),
        "health_problem": health_problem(summary),
        "chance_accuracy": (summary.get("evaluations") or [{}])[-1].get("chance_accuracy"),
        "evaluations": evaluations,
    }


def measured(
    runs: list[dict[str, Any]], dataset: str, strategy: str, lr: float, epochs: int
) -> str:
    """``0.975 (20 aggr.)``: the final accuracy of the run of ``dataset`` with these
    settings (and its health when not ``ok``), or ``not measured``."""
    for run in runs:
        config, resolved = run["run_config"], run["resolved"]
        if (
            config["dataset"] == dataset
            and config.get("strategy", "teasq") == strategy
            and resolved["learning-rate"] == lr
            and resolved["local-epochs"] == epochs
        ):
            length = (
                f"{run['fedavg_rounds']} rounds"
                if strategy == "fedavg"
                else f"{run['teasq_aggregations']} aggr."
            )
            verdict = "" if run["health"] == "ok" else f", {run['health']}"
            return f"{run['final_accuracy']:.3f} ({length}{verdict})"
    return "not measured"


def table(document: dict[str, Any]) -> str:
    """docs/configuration.md's table of per-dataset defaults: the registry's values beside
    what the committed runs measured with them and with the app's old defaults (0.1, 3)."""
    from fedsync.data.registry import dataset_info
    from fedsync.models import default_model_for

    lines = [
        "| dataset | model (`auto`) | learning-rate | local-epochs | partitioning | chance | "
        "TEASQ, these defaults | TEASQ, lr 0.1 x 3 epochs | FedAvg, these defaults |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = document.get("runs", [])
    for dataset in CANDIDATES:
        auto = dataset_info(dataset).training
        lr, epochs = auto.learning_rate, auto.local_epochs
        chances = [r["chance_accuracy"] for r in runs if r["run_config"]["dataset"] == dataset]
        chance = f"{chances[0]:.3f}" if chances and chances[0] is not None else "?"
        lines.append(
            f"| {dataset} | {default_model_for(dataset)} | {lr} | {epochs} | "
            f"{auto.partitioning} | {chance} | {measured(runs, dataset, 'teasq', lr, epochs)} | "
            f"{measured(runs, dataset, 'teasq', 0.1, 3)} | "
            f"{measured(runs, dataset, 'fedavg', lr, epochs)} |"
        )
    return "\n".join(lines)


def commit() -> str:
    """The commit measured, ``+dirty`` when the tree has changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    """Run every candidate of every dataset asked for; write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dataset_defaults")
    parser.add_argument("--datasets", default=",".join(CANDIDATES))
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--aggregations", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="FedAvg rounds")
    parser.add_argument("--strategies", default="teasq,fedavg", help="which of teasq, fedavg")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/dataset_defaults.json")
    parser.add_argument(
        "--table",
        action="store_true",
        help="print docs/configuration.md's table from --out and exit",
    )
    args = parser.parse_args(argv)
    if args.table:
        print(table(RunSummary.read(Path(args.out))))
        return 0

    from fedsync.deploy import LocalSuperLink
    from fedsync.simulations.cleanup import stop_superlink

    os.environ.setdefault("RAY_ADDRESS", "local")
    data_dir = str(Path(args.data_dir).resolve())
    out = Path(args.out)
    datasets, strategies = args.datasets.split(","), args.strategies.split(",")
    kept = RunSummary.read(out).get("runs", []) if out.is_file() else []
    runs: list[dict[str, Any]] = [
        r
        for r in kept
        if r["run_config"]["dataset"] not in datasets
        or r["run_config"].get("strategy", "teasq") not in strategies
    ]
    document: dict[str, Any] = {
        "description": "local-training defaults per dataset: the app's quickstart settings "
        "(10 simulated devices, app defaults) with candidate learning-rate / local-epochs",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "runs": runs,
    }
    provenance = {
        "command": " ".join(["python -m benchmarks.dataset_defaults", *(argv or sys.argv[1:])]),
        "commit": commit(),
        "seed": args.seed,
        "supernodes": 10,
        "teasq_aggregations": args.aggregations,
        "eval_every": args.eval_every,
        "fedavg_rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory(prefix="dataset-defaults-") as tmp:
        link = LocalSuperLink(Path(tmp) / "superlink", simulation=True)
        link.start()
        try:
            for dataset in datasets:
                base = {"dataset": dataset, "data-dir": data_dir, "seed": args.seed}
                base.update({"plots": False, "fraction-evaluate": 0.0, "probe-timeout": 120.0})
                jobs = [
                    (
                        f"{dataset}-teasq-lr{lr}-e{epochs}",
                        {
                            **base,
                            "learning-rate": lr,
                            "local-epochs": epochs,
                            "max-aggregations": args.aggregations,
                            "eval-every": args.eval_every,
                        },
                    )
                    for lr, epochs in CANDIDATES[dataset]
                    if "teasq" in strategies
                ]
                if "fedavg" in strategies:
                    jobs.append(
                        (
                            f"{dataset}-fedavg-auto",
                            {**base, "strategy": "fedavg", "num-rounds": args.rounds},
                        )
                    )
                for name, values in jobs:
                    load = os.getloadavg()[0]
                    result = run_one(link, values, Path(tmp) / "results", name)
                    result.update(provenance, load_average_1min_start=round(load, 2))
                    runs.append(result)
                    print(
                        f"{name:<36} {result['status']:<20} final {result['final_accuracy']} "
                        f"best {result['best_accuracy']} loss {result['final_loss']} "
                        f"health {result['health']} ({result['wall_seconds']} s)",
                        flush=True,
                    )
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        finally:
            stop_superlink(link)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
