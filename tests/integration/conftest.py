"""Fixtures for integration tests: real Flower processes, stopped by process id."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fedsync.deploy import LocalDeployment
    from fedsync.simulations.results import Comparison, RunResult

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def argv_after_exec(pid: int, timeout: float = 15.0) -> list[str]:
    """The command line ``pid`` runs, waiting out the window in which it is still exec'ing.

    ``subprocess.Popen`` returns once the child's close-on-exec pipe closes, which the
    kernel does before it sets the new program's arguments: read at once, on a loaded
    machine, ``/proc/<pid>/cmdline`` can be empty for a live process (CI saw it).

    Raises
    ------
    AssertionError
        When the process is gone, or still has no command line after ``timeout`` s.
    """
    from fedsync.deploy.proctree import alive, cmdline

    deadline = time.monotonic() + timeout
    while True:
        argv = cmdline(pid)
        if argv:
            return argv
        if not alive(pid):
            raise AssertionError(f"pid {pid} exited before its command line could be read")
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} has no command line after {timeout:.0f}s")
        time.sleep(0.05)


def live_group_members(pgids: Iterable[int]) -> list[int]:
    """Pids of live processes whose process group is one of ``pgids`` (Linux /proc)."""
    wanted = set(pgids)
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start at ") ".
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in wanted and state != "Z":
            alive.append(int(entry.name))
    return alive


def run_comparison(name: str, tmp_path: Path) -> tuple[Comparison, list[RunResult]]:
    """Run a shipped scenario through the real app, as ``python -m fedsync.simulations.compare``
    does; write its reports to ``tmp_path/out``.

    Asserts that the runner started processes and left none running (checked even when
    a run raised), and that every run completed.
    """
    from fedsync.simulations.compare import ComparisonRunner
    from fedsync.simulations.report import write_reports
    from fedsync.simulations.results import build_comparison
    from fedsync.simulations.scenario import load_scenario

    scenario = load_scenario(name)
    runner = ComparisonRunner(scenario, tmp_path / "runs")
    try:
        results = runner.run()
    finally:
        assert runner.started_pids
        assert live_group_members(runner.started_pids) == []
    comparison = build_comparison(scenario, results)
    write_reports(comparison, tmp_path / "out")
    for result in results:
        assert result.completed, f"{result.label}: {result.status}\n{result.details}"
    assert [r.label for r in results] == scenario.labels
    return comparison, results


def run_simulation(
    tmp_path: Path,
    project_root: Path,
    run_config: dict[str, Any],
    *,
    name: str = "sim",
    nodes: int = 3,
    timeout: float = 480.0,
) -> Path:
    """One ``flwr run`` of the app on Flower's simulation engine (``nodes`` SuperNodes)
    through a local SuperLink; returns the run's results folder.

    Asserts that the run completed and that nothing the SuperLink started is left.
    """
    from fedsync.deploy import LocalSuperLink

    results = tmp_path / "results"
    link = LocalSuperLink(tmp_path / "run", simulation=True)
    link.start()
    pids = [link.process.pid] if link.process else []
    try:
        outcome = link.run_app(
            project_root,
            {**run_config, "results-dir": str(results), "run-name": name},
            federation_config={"num-supernodes": nodes, "client-resources-num-cpus": 1},
            timeout=timeout,
        )
    finally:
        link.stop()
    assert outcome.completed, f"{outcome.status} {outcome.details}\n{outcome.output[-3000:]}"
    assert live_group_members(pids) == []
    return results / name


@pytest.fixture
def project_root() -> Path:
    """The Flower app folder (this repository)."""
    return PROJECT_ROOT


@pytest.fixture(autouse=True)
def _flower_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    # Ray inside the simulation must not see the test runner's thread settings.
    os.environ.pop("OMP_NUM_THREADS", None)


@pytest.fixture
def namespaces_allowed() -> None:
    """Skip a test that needs network namespaces (root, ``ip netns``) where there are none."""
    from fedsync.deploy.netns import netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(f"needs network namespaces: {reason}")


PATHS = ("stock", "warm")
"""The two node paths the deployment tests run on: Flower's own SuperNodes, which start a
ClientApp process per message, and ``fedsync-node``'s warm executors."""


def deployment_kind(path: str) -> type[LocalDeployment]:
    """The deployment class of a path in :data:`PATHS`."""
    from fedsync.deploy import LocalDeployment
    from fedsync.deploy.warm import WarmLocalDeployment

    return WarmLocalDeployment if path == "warm" else LocalDeployment
