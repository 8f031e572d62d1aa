"""Which Grids get concurrent reply pulls, and that closing them leaves no thread.

The pulls themselves run against a real SuperLink in
``tests/integration/test_concurrent_pulls.py`` and every deployment test.
"""

from __future__ import annotations

import threading
from typing import cast

import pytest
from flwr.serverapp import Grid
from flwr.superlink.grid.http_grid import HttpGrid

from fedsync.serverapp import reply_pulls
from fedsync.serverapp.channel import GridChannel
from fedsync.serverapp.reply_pulls import ReplyPulls, concurrent_pulls
from tests.unit.test_async_run import FakeGrid


def _pull_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fedsync-pull")]


def test_flowers_http_grid_gets_concurrent_pulls() -> None:
    grid = HttpGrid("127.0.0.1:9", insecure=True, token="t")  # connects on first use
    pulls = concurrent_pulls(grid, retry_from=0.05)
    assert isinstance(pulls, ReplyPulls)
    assert pulls.pull([]) == [] and pulls.pulling == frozenset()
    pulls.close()
    assert _pull_threads() == []
    with pytest.raises(RuntimeError, match="closed"):
        pulls.pull(["m"])


def test_other_grids_keep_their_own_pulls() -> None:
    grid = cast(Grid, FakeGrid([1, 2], lambda message: None))
    assert concurrent_pulls(grid, retry_from=0.05) is None
    channel = GridChannel(grid, task_ttl=60.0, sleep=lambda _: None)
    channel.close()  # nothing to end


def test_an_unexpected_layout_falls_back_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    monkeypatch.setattr(reply_pulls, "_layout_logged", False)
    monkeypatch.setattr(reply_pulls, "log", lambda level, text, *args: lines.append(text % args))
    monkeypatch.delattr(HttpGrid, "_runtime_client")
    grid = HttpGrid("127.0.0.1:9", insecure=True, token="t")
    assert concurrent_pulls(grid, retry_from=0.05) is None
    assert concurrent_pulls(grid, retry_from=0.05) is None
    assert len(lines) == 1 and "_runtime_client" in lines[0]


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        ReplyPulls(HttpGrid("127.0.0.1:9", insecure=True, token="t"), workers=0)


def test_a_too_large_pull_response_is_logged_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Flower's own pull: HTTP 413 on ``PullMessages`` is logged and nothing is pulled;
    any other HTTP error is the caller's."""
    import httpx

    status = {"code": 413}

    class Client:
        def PullMessages(self, request: object) -> None:
            response = httpx.Response(status["code"], request=httpx.Request("POST", "http://x"))
            raise httpx.HTTPStatusError("refused", request=response.request, response=response)

    lines: list[str] = []
    monkeypatch.setattr(reply_pulls, "log", lambda level, text, *args: lines.append(text % args))
    monkeypatch.setattr(HttpGrid, "_runtime_client", property(lambda self: Client()))
    pulls = ReplyPulls(HttpGrid("127.0.0.1:9", insecure=True, token="t"))
    try:
        assert pulls.pull(["m1", "m2"]) == [] and pulls.pulling == frozenset()
        assert len(lines) == 1 and "2 replies" in lines[0]
        status["code"] = 500
        with pytest.raises(httpx.HTTPStatusError):
            pulls.pull(["m1"])
    finally:
        pulls.close()
