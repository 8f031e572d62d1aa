"""Several seeds of one comparison: each headline number per seed, and its spread.

::

    python -m fedsync.simulations.compare fmnist-ci --seed 1 --out results/ci-seed1
    python -m fedsync.simulations.compare fmnist-ci --seed 2 --out results/ci-seed2
    python -m fedsync.simulations.seeds results/ci-seeds results/ci-seed1 results/ci-seed2

Reads ``comparison.json`` of every folder given (:mod:`fedsync.simulations.compare`): one
comparison (:data:`SAME`), each folder under a seed of its own; ``--only a,b`` keeps those
strategies (a seed's full comparison may hold rows the others did not run). Writes
``seeds.json`` and ``seeds.md`` into ``OUT``: per strategy and headline metric
(:data:`METRICS`) the value of every seed, in seed order, and the mean, minimum and
maximum over the seeds that have one (``n`` of them: a run that did not reach the target,
or a strategy a seed did not run, has none); and the ratio of means of the total bytes to
the target, the baseline's over the strategy's, over the seeds where both reached the
target (:func:`fewer_of_means`). Every seed fixes its own target from its own runs, and
its ratios are against its own baseline run; ``inputs`` lists each folder with its seed,
its target, and the commit, command, date and machine of its ``provenance``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsync.reports.provenance import provenance
from fedsync.simulations.report import fmt

__all__ = [
    "METRICS",
    "TOTAL_BYTES",
    "Metric",
    "SeedsError",
    "fewer_of_means",
    "main",
    "read_inputs",
    "spread",
    "summarize",
    "write_markdown",
]

SAME = ("scenario", "scale", "baseline", "target_rule", "smoothing_window")
"""Fields every input's ``comparison.json`` must agree on: one comparison, other seeds."""


class SeedsError(ValueError):
    """The inputs are not comparisons of one scenario with distinct seeds."""


@dataclass(frozen=True)
class Metric:
    """A headline number of a comparison row: its ``key`` in ``seeds.json``, its
    ``heading`` in ``seeds.md``, its ``path`` in a ``comparison.json`` row, and what
    ``seeds.md`` divides it by (``unit``, 1e6: bytes as MB) and formats it with (``spec``)."""

    key: str
    heading: str
    path: tuple[str, ...]
    unit: float = 1.0
    spec: str = ".4f"

    def of(self, row: Mapping[str, Any] | None) -> float | None:
        """The value in ``row`` (``None``: no row, or no value there)."""
        value: Any = row
        for key in self.path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    def show(self, value: float | None) -> str:
        """``value`` for ``seeds.md``: ``not reached`` for a missing cost to the target."""
        if value is None:
            return "not reached" if self.path[0] in ("target", "target_smoothed") else "-"
        return fmt(value / self.unit, self.spec)


def _megabytes(key: str, heading: str, *path: str) -> Metric:
    return Metric(key, heading, path, unit=1e6, spec=".3f")


TOTAL_BYTES = _megabytes("bytes_total_to_target", "MB total to target", "target", "bytes_total")
"""Bytes up + down to the target, whose means give :func:`summarize`'s ratio of means."""

METRICS = (
    Metric("final_accuracy", "final acc", ("final_accuracy",)),
    Metric("final_loss", "final loss", ("final_loss",)),
    Metric("sim_time_to_target", "sim s to target", ("target", "sim_time"), spec=".1f"),
    Metric(
        "sim_time_to_target_smoothed",
        "sim s to target (smoothed)",
        ("target_smoothed", "sim_time"),
        spec=".1f",
    ),
    TOTAL_BYTES,
    _megabytes(
        "bytes_total_to_target_smoothed",
        "MB total to target (smoothed)",
        "target_smoothed",
        "bytes_total",
    ),
    _megabytes("bytes_up_to_target", "MB up to target", "target", "bytes_up"),
    _megabytes("bytes_down_to_target", "MB down to target", "target", "bytes_down"),
    Metric(
        "total_bytes_ratio", "total-bytes ratio", ("ratios_vs_baseline", "total_bytes_to_target")
    ),
    Metric("time_ratio", "time ratio", ("ratios_vs_baseline", "time_to_target"), spec=".3f"),
    _megabytes("bytes_up_run", "MB up (run)", "total_bytes_up"),
    _megabytes("bytes_down_run", "MB down (run)", "total_bytes_down"),
)
"""The headline numbers summarized over the seeds, in ``seeds.md``'s order."""


def read_inputs(folders: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Every folder with its ``comparison.json`` document, in seed order.

    Raises
    ------
    SeedsError
        If fewer than two folders are given, a document is missing, unreadable or records
        no seed, two disagree on a field of :data:`SAME`, or two have the same seed.
    """
    if len(folders) < 2:
        raise SeedsError("give at least two comparison folders (one per seed)")
    inputs = []
    for folder in folders:
        path = folder / "comparison.json"
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SeedsError(f"{path}: {err}") from err
        if not isinstance(document, dict) or not isinstance(document.get("strategies"), list):
            raise SeedsError(f"{path}: not a comparison document")
        seed = document.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SeedsError(
                f"{path}: records no seed (written before compare had --seed); "
                f"`python -m fedsync.simulations.report {folder}` rewrites it with the "
                "scenario's seed"
            )
        inputs.append((folder, document))
    first_folder, first = inputs[0]
    for folder, document in inputs[1:]:
        for key in SAME:
            if document.get(key) != first.get(key):
                raise SeedsError(
                    f"{folder}: {key} {document.get(key)!r}, but {first_folder}: "
                    f"{first.get(key)!r} (the seeds must be of one comparison)"
                )
    seeds = [document["seed"] for _, document in inputs]
    twice = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if twice:
        raise SeedsError(f"seed {twice[0]} given twice: every folder must have its own seed")
    return sorted(inputs, key=lambda item: int(item[1]["seed"]))


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``values`` (one per seed, ``None`` where there is none) with ``n``, ``mean``,
    ``min`` and ``max`` over those there are (``None`` when there are none)."""
    present = [value for value in values if value is not None]
    return {
        "values": list(values),
        "n": len(present),
        "mean": statistics.fmean(present) if present else None,
        "min": min(present) if present else None,
        "max": max(present) if present else None,
    }


def fewer_of_means(
    mine: Sequence[float | None], theirs: Sequence[float | None]
) -> tuple[float, float, float] | None:
    """The ratio of means ``mean(theirs) / mean(mine)`` over the seeds where both have a
    value (a cost to the target: where both reached it), with the two means; ``None``
    where no seed has both, or ``mine``'s mean is 0."""
    pairs = [(a, b) for a, b in zip(mine, theirs, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    mean_mine = statistics.fmean(a for a, _ in pairs)
    mean_theirs = statistics.fmean(b for _, b in pairs)
    return (mean_theirs / mean_mine, mean_mine, mean_theirs) if mean_mine > 0 else None


def summarize(
    inputs: Sequence[tuple[Path, Mapping[str, Any]]], only: Sequence[str] | None = None
) -> dict[str, Any]:
    """The ``seeds.json`` document (less its ``provenance``) of :func:`read_inputs`'s
    inputs; strategies in the order they first appear, or those of ``only`` in its order.

    Raises
    ------
    SeedsError
        If a label of ``only`` is in no input.
    """
    documents = [document for _, document in inputs]
    first = documents[0]
    metric = first.get("target_metric", "accuracy")
    by_seed = [{row["label"]: row for row in document["strategies"]} for document in documents]
    labels = list(dict.fromkeys(label for rows in by_seed for label in rows))
    if only is not None:
        missing = [label for label in only if label not in labels]
        if missing:
            raise SeedsError(f"no input has strategy {missing[0]!r}; they have {labels}")
        labels = list(dict.fromkeys(only))
    strategies = []
    for label in labels:
        rows = [rows.get(label) for rows in by_seed]
        strategies.append(
            {
                "label": label,
                "strategy": next(row["strategy"] for row in rows if row is not None),
                "metrics": {m.key: spread([m.of(row) for row in rows]) for m in METRICS},
            }
        )
    totals = {s["label"]: s["metrics"][TOTAL_BYTES.key]["values"] for s in strategies}
    for strategy in strategies:
        base = totals.get(first["baseline"])
        fewer = fewer_of_means(totals[strategy["label"]], base) if base else None
        strategy["x_fewer_total_bytes"] = fewer[0] if fewer else None
    return {
        **{key: first.get(key) for key in SAME},
        "target_metric": metric,
        "inputs": [
            {
                "dir": str(folder),
                "seed": document["seed"],
                "commit": _origin(document, "commit"),
                "target": document.get(f"target_{metric}"),
                **{key: _origin(document, key) for key in ("command", "date", "machine")},
            }
            for folder, document in inputs
        ],
        "strategies": strategies,
    }


def _origin(document: Mapping[str, Any], key: str) -> Any:
    """``key`` of the document's ``provenance`` block (``None`` where it has none)."""
    origin = document.get("provenance")
    return origin.get(key) if isinstance(origin, dict) else None


def write_markdown(document: Mapping[str, Any], path: Path) -> Path:
    """``seeds.md``: the inputs, the ratio of means, and a table per strategy."""
    seeds = [i["seed"] for i in document["inputs"]]
    baseline, metric = document["baseline"], document["target_metric"]
    count = len(seeds)
    rule = document["target_rule"] or {}
    lines = [
        f"# {document['scenario']}: {count} seeds",
        "",
        f"Seeds {', '.join(map(str, seeds))} at scale {document['scale']:g}. Every seed "
        f"fixes its own target ({rule.get('kind')} {rule.get('value')}); mean, min and max "
        f"are over the seeds with a value (n of {count}). Ratios are strategy / `{baseline}` "
        "of the same seed. Smoothed: the first evaluation where the trailing mean of the "
        f"last {document['smoothing_window']} evaluations reaches the target.",
        "",
        f"| seed | folder | commit | target {metric} |",
        "|" + " --- |" * 4,
        *(
            f"| {i['seed']} | `{i['dir']}` | {i['commit'] or '-'} | {fmt(i['target'], '.4f')} |"
            for i in document["inputs"]
        ),
        "",
        f"Total bytes (up + down) to the target, ratio of means: `{baseline}`'s mean / the "
        "strategy's mean, over the seeds where both reached the target.",
        "",
        "| strategy | n | mean MB total to target | x fewer total bytes |",
        "|" + " --- |" * 4,
    ]
    for strategy in document["strategies"]:
        total = strategy["metrics"][TOTAL_BYTES.key]
        lines.append(
            f"| {strategy['label']} | {total['n']} of {count} | {TOTAL_BYTES.show(total['mean'])}"
            f" | {fmt(strategy['x_fewer_total_bytes'], '.2f')} |"
        )
    for strategy in document["strategies"]:
        lines += [
            "",
            f"## {strategy['label']} ({strategy['strategy']})",
            "",
            "| metric | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | min | max | n |",
            "|" + " --- |" * (count + 5),
        ]
        for m in METRICS:
            stats = strategy["metrics"][m.key]
            cells = [m.show(v) for v in stats["values"]]
            cells += [m.show(stats[key]) for key in ("mean", "min", "max")]
            lines.append(f"| {m.heading} | {' | '.join(cells)} | {stats['n']} of {count} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedsync.simulations.seeds OUT DIR1 DIR2 ...``: write ``OUT/seeds.json``
    and ``OUT/seeds.md`` from ``DIR*/comparison.json``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.simulations.seeds",
        description="Summarize comparisons of one scenario run with different seeds.",
    )
    parser.add_argument("out", help="folder for seeds.json and seeds.md")
    parser.add_argument("dirs", nargs="+", help="comparison folders (comparison.json), one a seed")
    parser.add_argument(
        "--only", help="comma-separated strategy labels to summarize (default: every one)"
    )
    args = parser.parse_args(argv)
    only = [label for label in args.only.split(",") if label] if args.only else None
    try:
        inputs = read_inputs([Path(folder) for folder in args.dirs])
        document = summarize(inputs, only)
    except SeedsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    document["provenance"] = provenance("python -m fedsync.simulations.seeds", argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "seeds.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    for path in (json_path, write_markdown(document, out / "seeds.md")):
        print(f"[seeds] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
