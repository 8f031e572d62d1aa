"""``benchmarks.sim_scale``'s pieces that run without a simulation: the same tasks with no
Flower (real digits data, spawned workers), the ratios against a baseline tree's result,
the figures against nodes, ``--set`` entries, the count of node-state files, and the RSS
sampler over several process trees."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.proc_sampler import TreeSampler
from benchmarks.sim_scale import (
    against_nodes,
    baseline_ratios,
    node_state_files,
    plain_tasks,
    setting,
)


def test_the_plain_loop_runs_the_tasks_on_its_workers() -> None:
    config = {"strategy": "teasq", "dataset": "digits", "partitioning": "iid", "seed": 0}
    result = plain_tasks(config, 50, 6, 2, "topk:0.1+uniform:8+ef", "none+fp16")
    # 6 tasks over 2 workers: 4 each, the first of each a warm-up not timed
    assert result["workers"] == 2 and result["tasks"] == 6
    # the workers ran side by side: the rate is all tasks over the slower worker's time
    # (both rounded in the result: hence the tolerance)
    assert result["wall_s"] > 0
    assert result["updates_per_s"] == pytest.approx(6 / result["wall_s"], rel=0.05)


def test_ratios_against_the_baseline_are_new_over_old() -> None:
    new = {"loop": {"updates_per_s": 21.0, "loop_wall_s": 70.0, "probe_and_setup_s": 15.0}}
    old = {"loop": {"updates_per_s": 14.0, "loop_wall_s": 105.0}}
    assert baseline_ratios(new, old) == {
        "updates_per_s": 1.5,
        "loop_wall_s": 0.667,
        "probe_and_setup_s": None,  # the baseline has none
    }


def test_results_against_nodes_are_sorted_with_their_peaks(tmp_path: Path) -> None:
    paths = []
    for nodes, rate, tree in ((10_000, 22.9, [900.0, 4600.0, 4500.0]), (1_000, 21.0, [4400.0])):
        path = tmp_path / f"{nodes}.json"
        data = {
            "args": {"nodes": nodes},
            "loop": {"updates": 100, "updates_per_s": rate, "probe_and_setup_s": 1.0},
            "plain": {"updates_per_s": 60.0},
            "rss_series": {"tree_mb": tree},
            "provenance": {"commit": "abc1234"},
        }
        path.write_text(json.dumps(data))
        paths.append(path)
    out = tmp_path / "nodes.json"
    rows = against_nodes(paths, out)["against_nodes"]
    assert [(r["nodes"], r["updates_per_s"], r["peak_tree_rss_mb"]) for r in rows] == [
        (1_000, 21.0, 4400.0),
        (10_000, 22.9, 4600.0),
    ]
    assert json.loads(out.read_text())["against_nodes"] == rows
    assert out.with_suffix(".png").stat().st_size > 0


def test_set_reads_toml_literals_and_falls_back_to_text() -> None:
    assert setting("concurrency=8") == ("concurrency", 8)
    assert setting("node-state=disk") == ("node-state", "disk")
    assert setting('state-dir="/tmp/a b"') == ("state-dir", "/tmp/a b")
    assert setting("plots=false") == ("plots", False)
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        setting("node-state")


def test_node_state_files_are_counted_by_node(tmp_path: Path) -> None:
    job = tmp_path / "job-1"
    job.mkdir()
    for name, size in (("n3-codec.npz", 10), ("n3-base.npz", 30), ("n7-codec.npz", 5)):
        (job / name).write_bytes(b"x" * size)
    (job / ".n9-codec.npz.1.tmp").write_bytes(b"x")  # a write cut short: not state
    assert node_state_files(tmp_path) == {
        "files": 3,
        "bytes": 45,
        "largest_file_bytes": 30,
        "nodes": 2,
    }
    # The crash-safe codec states (state-dir's own level) name partitions: 3 nodes now.
    for partition in (0, 1, 2):
        (tmp_path / f"codec-job-1-p{partition}.npz").write_bytes(b"x" * 4)
    assert node_state_files(tmp_path)["nodes"] == 3


def test_the_sampler_reads_every_tree_it_is_given() -> None:
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])]
    sleepers.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
    try:
        sampler = TreeSampler(sleepers[0].pid, extra_roots=[sleepers[1].pid])
        sample = sampler.sample_once()
        assert {p.pid for p in sleepers} <= set(sample.rss)
        assert all(sample.rss[p.pid] > 0 for p in sleepers)
    finally:
        for process in sleepers:
            process.kill()
            process.wait()
