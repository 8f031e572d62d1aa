"""Two views of one comparison: quality at equal work, and at equal simulated time.

::

    python -m fedsync.simulations.views simulations/results/cross-site-lm/comparison.json \\
        --reference sparseloco --out simulations/results/cross-site-lm/views.json

Every row of a comparison gets the same budget of work (tasks of local steps), and an
asynchronous fleet finishes it several times sooner than a synchronous one, whose rounds
wait for the slowest site. So the final loss is the view at equal work; the view at
equal time asks what the reference row (a synchronous baseline) had reached by the
simulated second each row finished, and what each row had reached by the second the
reference finished (its own final value when it finished sooner: it would have had the
rest of that time to train on). Values between evaluations are the last evaluation's (a
model is only known where it was evaluated). The JSON (``views.json``) carries its
provenance, and the results pages render it as a table.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsync.reports.provenance import provenance
from fedsync.simulations.results import EvalPoint

__all__ = ["metric_at", "views"]


def _points(row: Mapping[str, Any]) -> list[EvalPoint]:
    """A row's evaluations (:meth:`EvalPoint.as_list` entries) as points."""
    return [EvalPoint(*entry) for entry in row.get("evaluations") or []]


def metric_at(points: Sequence[EvalPoint], time: float, metric: str) -> float | None:
    """``metric`` (``accuracy`` or ``loss``) of the last evaluation at or before simulated
    ``time`` (``None``: none then, or not a finite number)."""
    value = None
    for point in points:
        if point.sim_time > time:
            break
        value = float(getattr(point, metric))
    return value if value is not None and math.isfinite(value) else None


def views(comparison: Mapping[str, Any], reference: str) -> dict[str, Any]:
    """Every row's final and equal-time values against ``reference`` (a row label).

    Raises
    ------
    ValueError
        If ``reference`` is not a row, or a row did not finish or has no evaluations.
    """
    rows = {row["label"]: row for row in comparison["strategies"]}
    if reference not in rows:
        raise ValueError(f"no row {reference!r}; rows: {', '.join(rows)}")
    metric = "loss" if comparison.get("target_metric") == "loss" else "accuracy"
    series = {label: _points(row) for label, row in rows.items()}
    for label, row in rows.items():
        if row.get("sim_time") is None or not series[label]:
            raise ValueError(f"row {label!r} did not finish or has no evaluations")
    ref_end = float(rows[reference]["sim_time"])
    out: dict[str, Any] = {}
    for label, row in rows.items():
        end = float(row["sim_time"])
        out[label] = {
            "final": metric_at(series[label], math.inf, metric),
            "sim_time": end,
            "at_reference_end": metric_at(series[label], ref_end, metric),
            "reference_at_row_end": metric_at(series[reference], end, metric),
            "bytes_total": int(row["total_bytes_up"]) + int(row["total_bytes_down"]),
        }
    return {
        "scenario": comparison.get("scenario"),
        "metric": metric,
        "reference": reference,
        "reference_sim_time": ref_end,
        "rows": out,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m fedsync.simulations.views")
    parser.add_argument("comparison", type=Path, help="a comparison.json")
    parser.add_argument("--reference", required=True, help="the row whose end time is the mark")
    parser.add_argument("--out", type=Path, required=True, help="the views.json to write")
    args = parser.parse_args(argv)
    document = views(json.loads(args.comparison.read_text(encoding="utf-8")), args.reference)
    document["provenance"] = provenance("python -m fedsync.simulations.views", argv)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"[views] {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
