"""``fedsync-deploy``: run the app on a local SuperLink and N SuperNodes over gRPC.

Example::

    fedsync-deploy --nodes 3 --run-config "num-rounds=3" --workdir runs/deploy

starts ``flower-superlink`` with TLS and SuperNode authentication and three
``flower-supernode`` processes on loopback (each with ``partition-id=i
num-partitions=3`` and its own registered key), submits this app with ``flwr run``,
streams its log, reads the run's final status from the SuperLink, and stops every
process it started by process id. The exit code is 0 only when the run finished as
completed. ``--insecure`` turns TLS and authentication off (with a warning);
``--link-mbit 1,5,20`` puts each SuperNode in its own network namespace behind a link
of that rate (root only).

Two more commands prepare real machines::

    fedsync-deploy certs --out certs --san 192.168.1.10 --san DNS:superlink.lan
    fedsync-deploy node-key --out keys/node-0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsync.deploy.auth import generate_node_key
from fedsync.deploy.local import INSECURE_WARNING, InsecureDeploymentWarning, LocalDeployment
from fedsync.deploy.netns import LinkShape, ShapedNetwork
from fedsync.deploy.tls import generate_certificates

COMMANDS = ("run", "certs", "node-key")
"""Sub-commands; without one, ``run`` is meant (the original command line)."""


def parse_config(text: str) -> dict[str, Any]:
    """Parse ``"key=value key2=value2"`` (values: int, float, true/false or strings)."""
    config: dict[str, Any] = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        config[key] = _literal(raw.strip("\"'"))
    return config


def parse_rates(text: str) -> list[float]:
    """Parse ``"1,5,20"`` into Mbit/s rates (each > 0)."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected Mbit/s rates like 1,5,20, got {text!r}"
        ) from None
    if not rates or any(not rate > 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"rates must be > 0 Mbit/s, got {text!r}")
    return rates


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
    """The command line of ``fedsync-deploy [run]``."""
    parser = argparse.ArgumentParser(prog="fedsync-deploy", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="number of SuperNodes (default 3)")
    parser.add_argument("--app", type=Path, default=Path("."), help="the Flower app folder")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="run folder for FLWR_HOME, database, logs, certs, keys (default runs/deploy-<time>)",
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
    security = parser.add_argument_group("security (TLS and SuperNode authentication are on)")
    security.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no SuperNode authentication (clear text; trusted loopback only)",
    )
    security.add_argument(
        "--no-node-auth",
        action="store_true",
        help="TLS, but any SuperNode may join (no registered keys)",
    )
    security.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra subject alternative name of the server certificate (repeatable)",
    )
    links = parser.add_argument_group("shaped links (root: one network namespace per node)")
    links.add_argument(
        "--link-mbit",
        type=parse_rates,
        default=None,
        metavar="R[,R...]",
        help="symmetric link rate per node in Mbit/s (one value for all, or one per node)",
    )
    return parser


def build_certs_parser() -> argparse.ArgumentParser:
    """The command line of ``fedsync-deploy certs``."""
    parser = argparse.ArgumentParser(
        prog="fedsync-deploy certs",
        description="Write a CA and a SuperLink server certificate (SANs 127.0.0.1, "
        "localhost and every --san).",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the PEM files")
    parser.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="the SuperLink host's IP address or DNS name, as clients dial it (repeatable; "
        "IP:/DNS: prefixes optional)",
    )
    parser.add_argument("--days", type=int, default=365, help="validity (default 365)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    return parser


def build_node_key_parser() -> argparse.ArgumentParser:
    """The command line of ``fedsync-deploy node-key``."""
    parser = argparse.ArgumentParser(
        prog="fedsync-deploy node-key",
        description="Write a SuperNode key pair (OpenSSH ECDSA P-384, as "
        'ssh-keygen -t ecdsa -b 384 -N "").',
    )
    parser.add_argument("--out", type=Path, required=True, help="private key path (+ .pub)")
    parser.add_argument("--comment", default="", help="comment on the public key line")
    parser.add_argument("--force", action="store_true", help="overwrite an existing pair")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to ``run`` (default), ``certs`` or ``node-key``."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and args[0] in COMMANDS else "run"
    if args and args[0] in COMMANDS:
        args = args[1:]
    if command == "certs":
        return certs_main(args)
    if command == "node-key":
        return node_key_main(args)
    return run_main(args)


def certs_main(argv: Sequence[str]) -> int:
    """``fedsync-deploy certs``: write the TLS files and print how to use them."""
    args = build_certs_parser().parse_args(argv)
    try:
        files = generate_certificates(
            args.out, hosts=args.san, days=args.days, overwrite=args.force
        )
    except (ValueError, FileExistsError) as err:
        raise SystemExit(f"fedsync-deploy certs: {err}") from err
    print(f"CA certificate  {files.ca_cert}   (copy to every SuperNode and CLI machine)")
    print(f"CA key          {files.ca_key}   (keep it off the SuperLink host)")
    print(f"server cert     {files.server_cert}")
    print(f"server key      {files.server_key}")
    print(f"SANs            {', '.join(files.subject_alt_names())}")
    print("flower-superlink " + " ".join(files.superlink_args()))
    print("flower-supernode " + " ".join(files.supernode_args()))
    return 0


def node_key_main(argv: Sequence[str]) -> int:
    """``fedsync-deploy node-key``: write one SuperNode key pair."""
    args = build_node_key_parser().parse_args(argv)
    key = generate_node_key(args.out, comment=args.comment, overwrite=args.force)
    print(f"private key  {key.private_key}   (stays on the SuperNode)")
    print(f"public key   {key.public_key}   (flwr supernode register {key.public_key.name} ...)")
    return 0


def run_main(argv: Sequence[str]) -> int:
    """Start the deployment, run the app, stop everything; 0 when the run completed."""
    args = build_parser().parse_args(argv)
    if args.nodes < 1:
        raise SystemExit("--nodes must be >= 1")
    if args.link_mbit is not None and len(args.link_mbit) not in (1, args.nodes):
        raise SystemExit(f"--link-mbit needs 1 or {args.nodes} rates, got {len(args.link_mbit)}")
    workdir = args.workdir or Path("runs") / time.strftime("deploy-%Y%m%d-%H%M%S")
    node_configs = [
        {"partition-id": i, "num-partitions": args.nodes, **args.node_config}
        for i in range(args.nodes)
    ]
    run_config = dict(args.run_config)
    run_config.setdefault("results-dir", str((workdir / "results").resolve()))
    run_config.setdefault("min-train-nodes", args.nodes)
    if args.insecure:
        print(f"WARNING: {INSECURE_WARNING}", file=sys.stderr)
    network = None
    if args.link_mbit is not None:
        rates = args.link_mbit * args.nodes if len(args.link_mbit) == 1 else args.link_mbit
        network = ShapedNetwork([LinkShape.symmetric(rate) for rate in rates])
    try:
        if network is not None:
            network.create()
            print(f"links: {json.dumps(network.describe())}")
        with warnings.catch_warnings():
            # Already printed above, in words a person reads.
            warnings.simplefilter("ignore", InsecureDeploymentWarning)
            deployment = LocalDeployment(
                workdir,
                node_configs,
                insecure=args.insecure,
                node_auth=False if args.no_node_auth or args.insecure else None,
                network=network,
                tls_hosts=args.san,
            )
            with deployment:
                print(
                    f"SuperLink pid {deployment.pids()[-1]}, "
                    f"SuperNode pids {deployment.pids()[:-1]}"
                )
                outcome = deployment.run_app(
                    args.app.resolve(), run_config, timeout=args.timeout, echo=True
                )
    finally:
        if network is not None:
            network.destroy()
    print(f"run {outcome.run_id}: {outcome.status} {outcome.details}".rstrip())
    print(f"logs and results in {workdir.resolve()}")
    return 0 if outcome.completed else 1
