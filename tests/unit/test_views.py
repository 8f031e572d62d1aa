"""The equal-work and equal-time views of a comparison (:mod:`fedsync.simulations.views`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsync.simulations.results import EvalPoint
from fedsync.simulations.views import main, metric_at, views


def row(label: str, end: float, losses: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "label": label,
        "sim_time": end,
        "total_bytes_up": 10,
        "total_bytes_down": 5,
        "evaluations": [[t, 0, 0, 0.5, loss] for t, loss in losses],
    }


COMPARISON = {
    "scenario": "demo",
    "target_metric": "loss",
    "strategies": [
        row("sync", 9.0, [(0.0, 4.0), (3.0, 3.0), (6.0, 2.5), (9.0, 2.1)]),
        row("async", 5.0, [(0.0, 4.0), (2.5, 2.6), (5.0, 2.2)]),
    ],
}


def test_each_view_reads_the_last_evaluation_at_or_before_the_mark() -> None:
    document = views(COMPARISON, "sync")
    fast = document["rows"]["async"]
    assert fast["final"] == 2.2  # equal work
    assert fast["reference_at_row_end"] == 3.0  # the rounds had reached 3.0 by 5 s
    assert fast["at_reference_end"] == 2.2  # it had finished by 9 s
    assert document["rows"]["sync"]["at_reference_end"] == 2.1
    assert fast["bytes_total"] == 15 and document["metric"] == "loss"
    assert metric_at([EvalPoint(1.0, 0, 0, 0.1, 9.0)], 0.5, "loss") is None
    unfinished = {**COMPARISON, "strategies": [*COMPARISON["strategies"], {"label": "x"}]}
    with pytest.raises(ValueError, match="did not finish"):
        views(unfinished, "sync")


def test_the_command_writes_the_views_with_their_provenance(tmp_path: Path) -> None:
    source = tmp_path / "comparison.json"
    source.write_text(json.dumps(COMPARISON))
    out = tmp_path / "views.json"
    assert main([str(source), "--reference", "sync", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["provenance"]["command"].startswith("python -m fedsync.simulations.views")
    with pytest.raises(ValueError, match="no row 'nope'"):
        views(COMPARISON, "nope")
