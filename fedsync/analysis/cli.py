"""The sparsity-analysis command: ``python -m fedsync.analysis`` or ``fedsync analyze``.

Example (the README's)::

    python -m fedsync.analysis --clients 6 --tasks 3 --out runs/analysis/fmnist \\
        --run-config "dataset='fashion-mnist' dirichlet-alpha=0.5 local-epochs=1 local-steps=60"

Options mean what they mean in a run: ``--run-config`` takes the run's keys (data,
model, partitioning, local training, the uplink codec and its schedule, the strategy
and its ``buffer-size`` K), checked as ``fedsync run`` checks them; ``--codec``
overrides the uplink spec for every task. Writes ``analysis.json`` and four PNGs into
``--out`` and prints the recommendation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import torch

from fedsync.analysis.collect import collect_updates
from fedsync.analysis.report import OVERALL, PARTITIONS, analyse, plot_analysis, table
from fedsync.compression.errors import SpecError
from fedsync.config import RunConfig, SettingsError, check_keys

__all__ = ["build_parser", "main", "read_run_config"]


def read_run_config(items: Sequence[str]) -> RunConfig:
    """Flower's ``--run-config`` syntax (``key=value`` TOML literals), every key checked.

    Raises
    ------
    fedsync.config.SettingsError
        On a malformed string, an unknown key or a bad value.
    """
    from fedsync.compat.flower139 import parse_config_args

    for item in items:
        for token in item.split():
            if "=" not in token:
                raise SettingsError(f"run config: expected key=value, got {token!r}")
    try:
        values = parse_config_args(items)
    except click.ClickException as err:
        raise SettingsError(f"run config: {err.message}") from err
    check_keys(values)
    return RunConfig.from_run_config(values)


def _partitions(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 2,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"partition counts must be >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(
        prog="fedsync analyze",
        description="Train for a few tasks per client and measure the real updates' sparsity: "
        "density, union growth, overlap, partition imbalance, index coding costs.",
    )
    parser.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        help="run-config keys as for `fedsync run` (repeatable)",
    )
    parser.add_argument("--clients", type=int, default=6, help="clients (data partitions)")
    parser.add_argument("--tasks", type=int, default=3, help="tasks (rounds) per client")
    parser.add_argument("--codec", default=None, help="uplink codec spec (default: the run's)")
    parser.add_argument(
        "--partitions",
        type=_partitions,
        default=list(PARTITIONS),
        help="partition counts for the imbalance, e.g. 2,4,8,16",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1, as a simulated client has)"
    )
    parser.add_argument("--out", required=True, help="folder for analysis.json and the PNGs")
    parser.add_argument("--quiet", action="store_true", help="print only the recommendation")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the analysis; returns the exit code (2 for bad settings)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    if args.clients < 2 or args.tasks < 1 or args.threads < 1:
        print(
            "error: --clients must be >= 2 (overlap needs two), --tasks and --threads >= 1",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    try:
        config = read_run_config(args.run_config)
        collection = collect_updates(
            config,
            clients=args.clients,
            rounds=args.tasks,
            codec=args.codec,
            log=None if args.quiet else print,
        )
    except (SettingsError, SpecError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = analyse(collection, partitions=args.partitions)
    report["settings"] = _settings(config, args, collection)
    report["settings"]["command"] = "fedsync analyze " + " ".join(map(_quoted, arguments))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_analysis(report, out)
    if not args.quiet:
        print("\n".join(table(report)))
    for line in report["recommendation"]["summary"]:
        print(line)
    model = report["layers"][OVERALL]
    print(
        f"mean frame {report['sent']['payload_bytes_per_update']:.0f} B "
        f"(dense float32 {report['sent']['dense_float32_bytes']} B); one update keeps "
        f"{model['density']['mean']:.4f}; results in {out}"
    )
    return 0


def _settings(config: RunConfig, args: argparse.Namespace, collection: Any) -> dict[str, Any]:
    training = config.training
    return {
        "run_config": config.as_run_config(),
        "dataset": training.dataset,
        "model": training.model,
        "partitioning": training.partitioning,
        "dirichlet_alpha": training.dirichlet_alpha,
        "clients": args.clients,
        "tasks": args.tasks,
        "codecs": sorted({u.spec for u in collection.updates}),
    }


def _quoted(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg
