"""``fedsync-deploy``: run the app on a local SuperLink and N SuperNodes over gRPC.

Example::

    fedsync-deploy --nodes 3 --run-config "num-rounds=3" --workdir runs/deploy

starts ``flower-superlink`` and three ``flower-supernode`` processes on loopback (each
with ``partition-id=i num-partitions=3``), submits this app with ``flwr run``, streams
its log, reads the run's final status from the SuperLink, and stops every process it
started by process id. The exit code is 0 only when the run finished as completed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsync.deploy.local import LocalDeployment


def parse_config(text: str) -> dict[str, Any]:
    """Parse ``"key=value key2=value2"`` (values: int, float, true/false or strings)."""
    config: dict[str, Any] = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        config[key] = _literal(raw.strip("\"'"))
    return config


def _literal(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``fedsync-deploy``."""
    parser = argparse.ArgumentParser(prog="fedsync-deploy", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="number of SuperNodes (default 3)")
    parser.add_argument("--app", type=Path, default=Path("."), help="the Flower app folder")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="run folder for FLWR_HOME, database and logs (default runs/deploy-<time>)",
    )
    parser.add_argument(
        "--run-config", type=parse_config, default={}, help='overrides, "key=value ..."'
    )
    parser.add_argument(
        "--node-config",
        type=parse_config,
        default={},
        help='extra node config for every node, e.g. "device=cuda:0"',
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Start the deployment, run the app, stop everything; 0 when the run completed."""
    args = build_parser().parse_args(argv)
    if args.nodes < 1:
        raise SystemExit("--nodes must be >= 1")
    workdir = args.workdir or Path("runs") / time.strftime("deploy-%Y%m%d-%H%M%S")
    node_configs = [
        {"partition-id": i, "num-partitions": args.nodes, **args.node_config}
        for i in range(args.nodes)
    ]
    run_config = dict(args.run_config)
    run_config.setdefault("results-dir", str((workdir / "results").resolve()))
    run_config.setdefault("min-train-nodes", args.nodes)
    with LocalDeployment(workdir, node_configs) as deployment:
        print(f"SuperLink pid {deployment.pids()[-1]}, SuperNode pids {deployment.pids()[:-1]}")
        outcome = deployment.run_app(
            args.app.resolve(), run_config, timeout=args.timeout, echo=True
        )
    print(f"run {outcome.run_id}: {outcome.status} {outcome.details}".rstrip())
    print(f"logs and results in {workdir.resolve()}")
    return 0 if outcome.completed else 1
