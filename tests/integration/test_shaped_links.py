"""Real links: three SuperNodes in their own network namespaces on 1, 5 and 20 Mbit/s.

Each SuperNode runs behind a veth pair shaped with ``tbf`` both ways; the SuperLink
(TLS, node authentication) listens on the host end of the first link. A small
asynchronous run on the wall clock completes, and ``links.json`` in the run's results
folder holds the bytes that crossed each link and every task's phases -- on warm nodes
(``fedsync-node``: SuperNode and executor both inside the node's namespace, on its
loopback). The biggest payload, the first task's whole
model (``mlp-wide``, about 600 kB in fp16), shows the shaping: it takes at least
``size / rate``, and far longer on the slowest link than on the fastest. (The app bundle,
the FAB, is only the app's ``pyproject.toml`` now: too small to show a rate.) Skips where
``ip netns`` is not permitted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fedsync.deploy.links import run_over_links
from fedsync.deploy.netns import LinkShape
from tests.integration.conftest import live_group_members

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RATES_MBIT = (1.0, 5.0, 20.0)


@pytest.mark.usefixtures("namespaces_allowed")
def test_async_run_over_shaped_links(tmp_path: Path, project_root: Path) -> None:
    """Warm nodes only: the shaping is the namespace's, the same under either node path,
    and stock nodes only added their per-task process start (80 s against 42 s)."""
    nodes = "warm"
    run = run_over_links(
        tmp_path,
        project_root,
        {
            "strategy": "teasq",
            "concurrency": 3,
            "buffer-size": 2,
            "max-aggregations": 3,
            "eval-every": 3,
            "local-epochs": 1,
            "model": "mlp-wide",  # a payload big enough for the links' rates to show
            "plots": False,
        },
        [LinkShape.symmetric(rate) for rate in RATES_MBIT],
        timeout=240,
        nodes=nodes,
    )
    # Everything started is gone: processes and namespaces.
    assert live_group_members(run.pids) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    report = json.loads((run.results / "links.json").read_text())
    assert all(link["namespace"] not in namespaces for link in report["links"])

    assert run.outcome.completed, f"{run.outcome.status} {run.outcome.details}"
    assert run.summary["aggregations"] == 3
    assert report["nodes"] == nodes

    fab = report["fab_bytes"]
    assert fab and fab > 0
    seconds_per_byte = []
    for link, rate in zip(report["links"], RATES_MBIT, strict=True):
        assert link["shape"] == {"uplink_mbit": rate, "downlink_mbit": rate}
        assert link["node_id"] == run.node_ids[link["index"]]
        summary = link["summary"]
        assert summary["tasks"] >= 1
        # The wire carries at least the payloads (plus TLS, gRPC, the FAB, polling).
        assert link["wire"]["downlink_bytes"] >= summary["bytes_down"] + fab
        assert link["wire"]["uplink_bytes"] >= summary["bytes_up"]
        for task in link["tasks"]:
            # Zero is possible on the warm path: a short task can finish while the
            # SuperNode still confirms the download over the link (fedsync.deploy.timing).
            assert task["round_trip_s"] > task["clientapp_s"] >= 0.0
            assert task["download_s"] > 0.0 and task["upload_s"] > 0.0
            assert task["download_s"] >= 0.8 * task["bytes_down"] * 8 / (rate * 1e6)
            # The server's clock joins the nodes' (SuperLink log): outside splits in two.
            assert task["poll_wait_s"] + task["pull_lag_s"] == pytest.approx(
                task["outside_s"], abs=0.01
            )
        # The FAB cannot arrive faster than its size over the link's rate.
        first = link["first_message"]
        assert first["download_s"] >= 0.9 * fab * 8 / (rate * 1e6)
        # Shaping works: the whole model takes ~size / rate, 20x longer at 1 than at 20 Mbit/s.
        biggest = max(link["tasks"], key=lambda task: task["bytes_down"])
        assert biggest["bytes_down"] > 300_000
        seconds_per_byte.append(biggest["download_s"] / biggest["bytes_down"])
    assert seconds_per_byte[0] > 3 * seconds_per_byte[2]
