"""Processes stopped by group id: timestamped logs, plain logs, no second signal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedsync.deploy.processes import read_timestamped_log, start_process


def test_timestamped_process_output(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    process = start_process(
        "printer",
        [sys.executable, "-c", "print('one'); print('two', flush=True)"],
        log_path=log,
        env={},
        timestamps=True,
    )
    process.popen.wait(timeout=30)
    process.stop(grace=1)
    lines = list(read_timestamped_log(log))
    assert [text for _, text in lines] == ["one", "two"]
    assert lines[0][0] <= lines[1][0]


def test_plain_process_output_is_unchanged(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    process = start_process(
        "printer", [sys.executable, "-c", "print('plain')"], log_path=log, env={}
    )
    process.popen.wait(timeout=30)
    process.stop(grace=1)
    assert log.read_text() == "plain\n"


def test_a_stopped_group_is_never_signalled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    process = start_process(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / "s.log", env={},
    )  # fmt: skip
    process.kill()
    assert process.poll() is not None
    signalled: list[int] = []
    monkeypatch.setattr(
        "fedsync.deploy.processes.os.killpg", lambda pgid, sig: signalled.append(pgid)
    )
    # The pid may belong to another process group by now: no second signal.
    process.stop(grace=1)
    process.kill()
    assert signalled == []
