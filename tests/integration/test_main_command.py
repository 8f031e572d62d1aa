"""The README's main command end to end at a tiny scale: ``fedsync compare quickstart``
as its own process, the real Flower simulation engine underneath. It must finish with
the short table and the figure, and leave no process behind: every process that
inherited this run's marker variable (the SuperLink, the SuperExec, the ServerApp, Ray)
is gone once the command has returned."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``marker`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0") and stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


def test_the_main_command_completes_and_leaves_nothing_running(
    tmp_path: Path, project_root: Path
) -> None:
    marker = f"FEDSYNC_TEST_RUN={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = {**os.environ, name: value, "CI": "true"}
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "fedsync.simulations.cli",
        "compare",
        "quickstart",
        "--scale",
        "0.05",  # teasq 2 aggregations, FedAvg 1 round
        "--out",
        str(out),
        "--run-dir",
        str(tmp_path / "runs"),
    ]
    result = subprocess.run(
        command, cwd=project_root, env=env, capture_output=True, text=True, timeout=540
    )
    left: list[int] = []
    for _ in range(20):  # processes being reaped right after the exit
        left = processes_with(marker)
        if not left:
            break
        time.sleep(0.5)
    assert left == [], f"still running: {left}"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "target accuracy" in result.stdout
    assert f"figure: {out / 'comparison.png'}" in result.stdout
    assert (out / "comparison.png").stat().st_size > 0
