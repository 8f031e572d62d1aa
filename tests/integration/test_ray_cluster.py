"""The simulation on a Ray cluster: two Ray nodes, ClientApps on both.

Two ``ray start --block`` nodes on this machine (a head and a worker, one CPU and a
custom resource each, their own ports) form the cluster; a simulation SuperLink started
with ``RAY_ADDRESS`` pointing at the head runs the real app. Flower's simulation then
joins that cluster instead of starting its own Ray, so its two ClientApp actors (one
CPU each) land one on each node.

Which node ran a ClientApp is read from ``/proc``: a Ray worker is a child of its node's
raylet, hence a descendant of that node's ``ray start`` process, and Ray titles the
worker ``ray::ClientAppActor.run`` while it executes Flower's ``ClientAppActor.run``
(one ClientApp call) -- the test samples the titles under each node during the run.
Everything started is stopped by pid at the end (never ``ray stop``, which would also
end other users' Ray processes on the machine).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from fedsync.deploy import DeploymentError, LocalSuperLink
from fedsync.deploy.local import _flwr_bin
from fedsync.deploy.proctree import alive, cmdline, descendants, process_name
from fedsync.deploy.ray_cluster import LocalRayCluster, RayNodeSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

RAY_DAEMONS = ("gcs_server", "raylet")


def _title(pid: int) -> str:
    argv = cmdline(pid)
    return argv[0] if argv else ""


class ActorWatch:
    """Samples, per Ray node, the ClientApp actor processes and whether they ran a call."""

    def __init__(self, cluster: LocalRayCluster, link_pid: int, interval: float = 0.1) -> None:
        self.cluster = cluster
        self.link_pid = link_pid
        self.interval = interval
        self.link_programs: set[str] = set()
        """Program names seen under the SuperLink (its ServerApp, flwr-simulation, ...)."""
        self.actors: dict[str, set[int]] = defaultdict(set)
        self.running: dict[str, set[int]] = defaultdict(set)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ActorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for spec, process in zip(self.cluster.nodes, self.cluster.processes, strict=True):
                for pid in descendants(process.pid):
                    title = _title(pid)
                    if title.startswith("ray::ClientAppActor"):
                        self.actors[spec.name].add(pid)
                    if title.startswith("ray::ClientAppActor.run"):
                        self.running[spec.name].add(pid)
            for pid in descendants(self.link_pid):
                self.link_programs.add(process_name(pid))
            self._stop.wait(self.interval)


@pytest.fixture
def _ray_cli() -> None:
    try:
        _flwr_bin("ray")
    except DeploymentError:
        pytest.skip("the ray command is not installed (flwr[simulation] brings it)")


@pytest.mark.usefixtures("_ray_cli")
def test_simulation_runs_clientapps_on_both_ray_nodes(
    tmp_path: Path, project_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = LocalRayCluster(
        tmp_path / "ray", nodes=(RayNodeSpec("head", 1), RayNodeSpec("worker", 1))
    )
    results = tmp_path / "results"
    link = LocalSuperLink(tmp_path / "run", simulation=True)
    started: list[int] = []
    cluster.start()
    try:
        started += [p.pid for p in cluster.processes]
        # What flwr-simulation's ray.init() reads: join this cluster.
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        link.start()
        assert link.process is not None
        started.append(link.process.pid)
        with ActorWatch(cluster, link.process.pid) as watch:
            outcome = link.run_app(
                project_root,
                {
                    "strategy": "fedavg",
                    "num-rounds": 2,
                    "local-epochs": 1,
                    "fraction-evaluate": 0.0,
                    "plots": False,
                    "results-dir": str(results),
                    "run-name": "ray",
                },
                federation_config={"num-supernodes": 4, "client-resources-num-cpus": 1},
                timeout=240,
            )
        node_names = {spec.name for spec in cluster.nodes}
    finally:
        link.stop()
        cluster.stop()

    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    summary = json.loads((results / "ray" / "summary.json").read_text())
    assert len(summary["evaluations"]) == 3
    # Flower joined the cluster: no Ray daemons of its own under the SuperLink.
    assert "flwr-simulation" in watch.link_programs
    assert not watch.link_programs & set(RAY_DAEMONS), watch.link_programs
    # One actor per node (one CPU each), and each executed ClientApp calls.
    assert set(watch.actors) == node_names, dict(watch.actors)
    assert set(watch.running) == node_names, dict(watch.running)
    assert not set(watch.actors["head"]) & set(watch.actors["worker"])
    # Nothing left running: node commands, their daemons and workers, the SuperLink.
    leftovers = [pid for pid in [*started, *cluster.pids()] if alive(pid)]
    assert leftovers == []
