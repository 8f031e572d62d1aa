"""Replies pulled concurrently: a fast node's reply is not held back by a slow upload.

Two warm nodes over shaped links (real SuperLink, SuperNodes and ServerApp, TLS):
node 0 uploads its dense 1.2 MB update over a 1 Mbit/s uplink (about 10 s), node 1
has 20 Mbit/s both ways (about 0.5 s). The SuperLink announces node 0's reply as soon
as its upload starts; a ServerApp that pulls one reply after another would then wait
for that whole upload before it saw any other reply. With the concurrent pulls of
:mod:`fedsync.serverapp.reply_pulls` node 1's replies keep arriving while node 0's upload is
under way, and before it. The check is an ordering (arrivals inside the upload's
window, with seconds of margin), not a speed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fedsync.deploy.links import run_over_links
from fedsync.deploy.netns import LinkShape
from fedsync.reports import read_events
from tests.integration.conftest import live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SLOW, FAST = 0, 1
MARGIN_S = 2.0
"""Seconds at each end of the slow upload's window that do not count: the server picks
up the announced reply at its next poll, and an arrival just before the upload's end
proves nothing."""


@pytest.mark.usefixtures("namespaces_allowed")
def test_fast_reply_arrives_during_a_slow_upload(tmp_path: Path, project_root: Path) -> None:
    run = run_over_links(
        tmp_path,
        project_root,
        {
            "strategy": "fedasync",
            "concurrency": 2,
            "max-aggregations": 12,
            "eval-every": 100,
            "local-epochs": 1,
            "dataset": "digits",
            "model": "mlp-wide",
            "uplink-codec": "none+fp32",
            "downlink-kind": "full",
            "downlink-codec": "none+fp32",
            "plots": False,
        },
        [LinkShape(uplink_mbit=1.0, downlink_mbit=20.0), LinkShape.symmetric(20.0)],
        timeout=240,
        nodes="warm",
        supernode_poll=0.2,
    )
    assert live_group_members(run.pids) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(link["namespace"] not in namespaces for link in run.report["links"])
    assert run.outcome.completed, f"{run.outcome.status} {run.outcome.details}"

    arrivals = {
        event["task"]: float(event["wall_time"])
        for event in read_events(run.results / "events.jsonl", "arrival")
    }
    slow = [t for t in run.timings if t.node_index == SLOW and t.task in arrivals]
    fast = [arrivals[t.task] for t in run.timings if t.node_index == FAST and t.task in arrivals]
    assert slow, "the slow node completed no task"
    during = []
    for task in slow:
        assert task.pull_lag_s is not None
        assert task.upload_s > 3 * MARGIN_S  # the shaping made the upload slow
        sent = arrivals[task.task] - task.pull_lag_s  # the node's Sent, server time
        window = (sent - task.upload_s + MARGIN_S, sent - MARGIN_S / 4)
        during += [at for at in fast if window[0] < at < window[1]]
    # One after another, nothing arrives while an announced upload is under way.
    assert during, f"no fast reply arrived during a slow upload: {slow} {sorted(fast)}"
