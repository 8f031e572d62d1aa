"""Stopping a SuperLink stops what it started: a detached grandchild (as Flower starts
the SuperExec, in a session of its own) that outlives the leader's process group is
found by ancestry and stopped by pid. Real processes, no Flower."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsync.simulations.cleanup import descendants, stop_superlink

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")

# The leader starts a grandchild in a new session (outside the leader's group), like
# flower-superlink starting flower-superexec, and both sleep.
TREE = (
    "import subprocess, sys, time;"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
    " start_new_session=True);"
    "time.sleep(120)"
)


class GroupProcess:
    """A leader in its own process group; ``stop`` ends the group only (as
    ``LocalSuperLink.stop`` does)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def test_a_detached_grandchild_is_stopped_too() -> None:
    link = GroupProcess()
    try:
        deadline = time.monotonic() + 30
        while not descendants(link.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        below = descendants(link.process.pid)
        assert len(below) == 1
        (grandchild,) = below
        assert os.getpgid(grandchild) != link.process.pid  # outside the leader's group
        stopped = stop_superlink(link, grace=5.0)
        assert stopped == [grandchild]
        deadline = time.monotonic() + 10
        while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
            # Reaped by init once it died; a zombie until then.
            stat = Path(f"/proc/{grandchild}/stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":
                break
            time.sleep(0.1)
        else:
            assert not Path(f"/proc/{grandchild}").exists()
    finally:
        if link.process.poll() is None:
            os.killpg(link.process.pid, signal.SIGKILL)
            link.process.wait(timeout=10)


def test_nothing_to_stop_when_the_tree_ended_with_its_leader() -> None:
    class Plain:
        def __init__(self) -> None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
            )

        def stop(self) -> None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    assert stop_superlink(Plain()) == []
