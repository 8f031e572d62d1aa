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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsync.reports.provenance import provenance

__all__ = ["metric_at", "views"]

_ACCURACY, _LOSS = 3, 4
"""Positions of accuracy and loss in a row's ``evaluations`` entries (``[sim_time,
bytes_up, bytes_down, accuracy, loss]``)."""


def metric_at(evaluations: Sequence[Sequence[float]], time: float, position: int) -> float | None:
    """The metric of the last evaluation at or before simulated ``time`` (``None``: none)."""
    value = None
    for entry in evaluations:
        if entry[0] > time:
            break
        value = entry[position]
    return None if value is None else float(value)


def views(comparison: Mapping[str, Any], reference: str) -> dict[str, Any]:
    """Every row's final and equal-time values against ``reference`` (a row label).

    Raises
    ------
    ValueError
        If ``reference`` is not a row, or a row has no evaluations.
    """
    rows = {row["label"]: row for row in comparison["strategies"]}
    if reference not in rows:
        raise ValueError(f"no row {reference!r}; rows: {', '.join(rows)}")
    position = _LOSS if comparison.get("target_metric") == "loss" else _ACCURACY
    ref = rows[reference]
    ref_end = float(ref["sim_time"])
    out: dict[str, Any] = {}
    for label, row in rows.items():
        evaluations = row.get("evaluations") or []
        if not evaluations:
            raise ValueError(f"row {label!r} has no evaluations")
        end = float(row["sim_time"])
        out[label] = {
            "final": float(evaluations[-1][position]),
            "sim_time": end,
            "at_reference_end": metric_at(evaluations, ref_end, position),
            "reference_at_row_end": metric_at(ref["evaluations"], end, position),
            "bytes_total": int(row["total_bytes_up"]) + int(row["total_bytes_down"]),
        }
    return {
        "scenario": comparison.get("scenario"),
        "metric": "loss" if position == _LOSS else "accuracy",
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
