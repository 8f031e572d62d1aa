"""One deployed run over shaped links, measured: bytes on each link and where time went.

:func:`run_over_links` builds a :class:`~fedsync.deploy.netns.ShapedNetwork` (one
namespace and rate-limited veth per SuperNode), starts a secure
:class:`~fedsync.deploy.local.LocalDeployment` on it, runs the app, stops every process
and removes every namespace, and writes ``links.json`` beside the run's
``events.jsonl``:

* per link: its rates, the bytes that crossed it during the run (everything on the wire:
  TLS, HTTP/2, gRPC, the app bundle, polling) and ``tbf`` drops;
* the first message each SuperNode handled (the probe), whose download includes the
  app bundle (FAB) every node fetches once per run -- on a slow link a visible cost;
* every task's phases (:mod:`fedsync.deploy.timing`) and per-node summaries, next to
  what the link model predicts for the transfers alone (``bytes * 8 / rate``).

``nodes="stock"`` starts Flower's own ``flower-supernode`` in each namespace (a fresh
``flwr-clientapp`` process per task); ``nodes="warm"`` starts ``fedsync-node``
(:mod:`fedsync.deploy.node`) there instead: the SuperNode and its long-lived warm
executor, both children of the node's process inside the node's namespace, talking over
that namespace's loopback (:class:`~fedsync.deploy.warm.WarmLocalDeployment`).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fedsync.config import RunConfig
from fedsync.deploy.local import LocalDeployment, RunOutcome
from fedsync.deploy.netns import LinkCounters, LinkShape, ShapedNetwork
from fedsync.deploy.timing import (
    TaskTiming,
    parse_supernode_log,
    summarize,
    task_timings,
)
from fedsync.deploy.warm import WarmLocalDeployment

__all__ = [
    "NODE_KINDS",
    "LinkRun",
    "fab_bytes",
    "link_deployment",
    "link_report",
    "run_over_links",
]

NODE_KINDS: Final = ("stock", "warm")
"""How the nodes run their ClientApps (module docstring)."""

_MBIT = 1e6


@dataclass
class LinkRun:
    """What :func:`run_over_links` did.

    Attributes
    ----------
    outcome : RunOutcome
        The run's status as the SuperLink reports it.
    results : pathlib.Path
        The run's results folder (``events.jsonl``, ``summary.json``, ``links.json``).
    report : dict
        The contents of ``links.json``.
    pids : list of int
        Every process (group) the deployment started, all stopped by now.
    node_ids : dict of int to int
        SuperNode index -> registered Flower node id.
    timings : list of TaskTiming
        Every completed task's phases.
    """

    outcome: RunOutcome
    results: Path
    report: dict[str, Any]
    pids: list[int] = field(default_factory=list)
    node_ids: dict[int, int] = field(default_factory=dict)
    timings: list[TaskTiming] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        """The run's ``summary.json``."""
        data: dict[str, Any] = json.loads((self.results / "summary.json").read_text())
        return data


def run_over_links(
    workdir: Path,
    app_dir: Path,
    run_config: Mapping[str, Any],
    shapes: Sequence[LinkShape | None],
    *,
    node_configs: Sequence[Mapping[str, Any]] | None = None,
    timeout: float = 900.0,
    echo: bool = False,
    nodes: str = "stock",
    supernode_poll: float = 0.0,
) -> LinkRun:
    """Deploy the app with SuperNode ``i`` behind a link shaped ``shapes[i]`` and run it.

    Parameters
    ----------
    workdir : pathlib.Path
        Run folder (the deployment's files under ``run/``; results under
        ``run_config["results-dir"]`` or ``results/``).
    app_dir : pathlib.Path
        The Flower app.
    run_config : mapping
        Run config; ``results-dir`` and ``run-name`` default to ``workdir/results`` and
        ``"links"``, ``clock`` to ``wall`` and ``min-nodes`` to the number of nodes.
    shapes : sequence of LinkShape or None
        One per SuperNode (``None``: an unshaped link, still in its own namespace).
    node_configs : sequence of mapping, optional
        Default: ``partition-id=i num-partitions=n``.
    timeout : float
        Seconds for the run.
    echo : bool
        Print the run's log as it streams.
    nodes : {"stock", "warm"}
        Flower's SuperNodes, or ``fedsync-node`` warm nodes (module docstring).
    supernode_poll : float
        Warm nodes only: above 0, each SuperNode asks for work this often instead of
        Flower's fixed 3 s (``fedsync-node --supernode-poll``); 0 keeps Flower's poll.

    Raises
    ------
    ValueError
        An unknown ``nodes``, or a ``supernode_poll`` for stock nodes (checked before
        anything is built).
    fedsync.deploy.netns.NetnsUnavailable
        When namespaces cannot be used here.
    """
    _check_nodes(nodes, supernode_poll)
    count = len(shapes)
    node_configs = node_configs or [
        {"partition-id": i, "num-partitions": count} for i in range(count)
    ]
    config = {
        "results-dir": str((workdir / "results").resolve()),
        "run-name": "links",
        "clock": "wall",
        "min-nodes": count,
        **run_config,
    }
    output = RunConfig.from_run_config(config).output
    results = output.results_path() / output.run_name
    network = ShapedNetwork(shapes)
    try:
        network.create()
        described = network.describe()  # destroy() forgets the links
        deployment = link_deployment(
            workdir / "run", node_configs, network, nodes=nodes, supernode_poll=supernode_poll
        )
        try:
            deployment.start()
            before = network.counters()
            outcome = deployment.run_app(app_dir, config, timeout=timeout, echo=echo)
            traffic = [a.minus(b) for a, b in zip(network.counters(), before, strict=True)]
        finally:
            deployment.stop()
    finally:
        network.destroy()
    logs = [deployment.link.logs / f"supernode-{i}.log" for i in range(count)]
    superlink_log = deployment.link.logs / "superlink.log"
    timings = (
        task_timings(results / "events.jsonl", logs, superlink_log) if results.is_dir() else []
    )
    report = link_report(
        links=described,
        shapes=shapes,
        traffic=traffic,
        supernode_logs=logs,
        timings=timings,
        fab_size=fab_bytes(deployment.link.workdir / "superlink.db"),
        outcome=outcome,
        nodes=nodes,
        supernode_poll=supernode_poll,
    )
    if results.is_dir():
        (results / "links.json").write_text(json.dumps(report, indent=2) + "\n")
    return LinkRun(
        outcome=outcome,
        results=results,
        report=report,
        pids=deployment.pids(),
        node_ids=dict(deployment.node_ids),
        timings=timings,
    )


def link_deployment(
    workdir: Path,
    node_configs: Sequence[Mapping[str, Any]],
    network: ShapedNetwork,
    *,
    nodes: str = "stock",
    supernode_poll: float = 0.0,
) -> LocalDeployment:
    """The deployment :func:`run_over_links` starts on a created ``network``.

    Raises
    ------
    ValueError
        An unknown ``nodes`` kind, or ``supernode_poll`` set for stock nodes.
    """
    _check_nodes(nodes, supernode_poll)
    if nodes == "warm":
        return WarmLocalDeployment(
            workdir, node_configs, network=network, supernode_poll=supernode_poll
        )
    return LocalDeployment(workdir, node_configs, network=network)


def _check_nodes(nodes: str, supernode_poll: float) -> None:
    if nodes not in NODE_KINDS:
        raise ValueError(f"nodes must be one of {', '.join(NODE_KINDS)}, got {nodes!r}")
    if not supernode_poll >= 0.0:  # also refuses NaN
        raise ValueError(f"supernode_poll must be >= 0 seconds, got {supernode_poll}")
    if supernode_poll > 0.0 and nodes != "warm":
        raise ValueError(
            "supernode_poll needs warm nodes (fedsync-node); stock SuperNodes poll every 3 s"
        )


def link_report(
    *,
    links: Sequence[Mapping[str, Any]],
    shapes: Sequence[LinkShape | None],
    traffic: Sequence[LinkCounters],
    supernode_logs: Sequence[Path],
    timings: Sequence[TaskTiming],
    fab_size: int | None,
    outcome: RunOutcome,
    nodes: str = "stock",
    supernode_poll: float = 0.0,
) -> dict[str, Any]:
    """The ``links.json`` report (see the module docstring)."""
    per_link = []
    for index, (link, shape, counters, log) in enumerate(
        zip(links, shapes, traffic, supernode_logs, strict=True)
    ):
        node_id, messages = parse_supernode_log(log)
        first = messages[0] if messages else None
        own = [t for t in timings if t.node_index == index]
        entry: dict[str, Any] = {
            **link,
            "node_id": node_id,
            "wire": counters.as_dict(),
            "first_message": (
                {
                    "kind": first.kind,
                    # get_run + get_fab + the message's objects: the FAB dominates.
                    "download_s": round(first.received - first.receiving, 3),
                    "model_fab_download_s": _transfer_s(fab_size, shape, "down"),
                }
                if first is not None and first.received is not None
                else None
            ),
            "summary": summarize(own),
            "model": _link_model(own, shape),
            "tasks": [t.as_dict() for t in own],
        }
        per_link.append(entry)
    clientapp = (
        "the node's warm executor (pull, training, encoding, push) and the SuperNode's wait "
        "for the reply"
        if nodes == "warm"
        else "a fresh flwr-clientapp process (start, imports, data, training, encoding)"
    )
    return {
        "outcome": {"run_id": outcome.run_id, "status": outcome.status},
        "nodes": nodes,
        # 0: Flower's own fixed poll (3 s between a SuperNode's asks for work).
        "supernode_poll_s": supernode_poll,
        "fab_bytes": fab_size,
        "links": per_link,
        "notes": [
            "wire bytes are the host end's interface counters: TLS, HTTP/2, gRPC framing, "
            "TCP/IP headers, the FAB and the SuperNode's polling included",
            f"task phases: outside = SuperNode polling wait (poll_wait_s: dispatch to the "
            f"node's pull) + server pull lag (pull_lag_s: the node's Sent to the server's "
            f"arrival; clocks joined by the SuperLink's log of the dispatches); clientapp = "
            f"{clientapp}",
            "links are rate-limited only: this kernel has no netem (no delay, no loss)",
        ],
    }


def fab_bytes(database: Path) -> int | None:
    """Size of the app bundle (FAB) the SuperLink served, from its SQLite database."""
    if not database.is_file():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        try:
            rows = db.execute("SELECT length(content) FROM fab").fetchall()
        except sqlite3.Error:
            return None
    return max((int(size) for (size,) in rows), default=None)


def _transfer_s(nbytes: float | None, shape: LinkShape | None, direction: str) -> float | None:
    if nbytes is None or shape is None:
        return None
    rate = shape.downlink_mbit if direction == "down" else shape.uplink_mbit
    return round(nbytes * 8.0 / (rate * _MBIT), 3)


def _link_model(timings: Sequence[TaskTiming], shape: LinkShape | None) -> dict[str, Any]:
    """Mean payload transfer time per task as the simulator's link model has it."""
    if not timings or shape is None:
        return {}
    count = len(timings)
    down = sum(t.bytes_down for t in timings) / count
    up = sum(t.bytes_up for t in timings) / count
    return {
        "download_s": _transfer_s(down, shape, "down"),
        "upload_s": _transfer_s(up, shape, "up"),
        "measured_download_s": round(sum(t.download_s for t in timings) / count, 3),
        "measured_upload_s": round(sum(t.upload_s for t in timings) / count, 3),
    }
