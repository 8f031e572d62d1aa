"""The comparison's files: ``comparison.json``, ``comparison.md`` and the plots.

:func:`write_reports` writes them from a :class:`~fedsync.simulations.results.Comparison`:
the JSON document (:meth:`~fedsync.simulations.results.Comparison.as_dict`), a markdown table
with one row per strategy (and the staleness of the asynchronous runs' updates),
accuracy against simulated time and against cumulative total bytes, uplink plus downlink
(``comparison.png``), and the binned staleness histogram (``staleness.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: CI, SSH
import matplotlib.pyplot as plt

from fedsync.reports.provenance import provenance
from fedsync.simulations.results import (
    STALENESS_BINS,
    Comparison,
    RunResult,
    build_comparison,
    read_run,
    runs_of,
    staleness_bins,
)
from fedsync.simulations.scenario import ScenarioError, load_scenario

__all__ = [
    "fmt",
    "loss_table",
    "main",
    "mb",
    "plot_comparison",
    "plot_loss",
    "plot_staleness",
    "short_table",
    "write_markdown",
    "write_reports",
]


def write_markdown(comparison: Comparison, path: Path) -> Path:
    """``comparison.md``: the target and one table row per strategy."""
    scenario = comparison.scenario
    target = comparison.target
    lines = [
        f"# {scenario.name}",
        "",
        scenario.description,
        "",
        f"Target: {scenario.target.describe()} = **{fmt(target, '.4f')}**. "
        f"Ratios are strategy / `{scenario.baseline}` (below 1: less than the baseline). "
        "Time is simulated seconds on the fleet's virtual clock; bytes are real payloads.",
        "",
    ]
    if scenario.baseline not in {row["label"] for row in comparison.rows}:
        lines += [f"The baseline `{scenario.baseline}` was not run: no ratios.", ""]
    if scenario.scale != 1.0:
        lines += [
            f"Run lengths scaled by {scenario.scale:g} from the scenario file (`--scale`).",
            "",
        ]
    if scenario.seed is not None:
        lines += [f"Seed {scenario.seed} (run-config `seed` of every strategy).", ""]
    lines += [
        "| strategy | status | final acc | best acc | sim s to target | MB up to target "
        "| MB down to target | MB total to target | time ratio | uplink ratio "
        "| total-bytes ratio | rounds / aggregations | sim s total | MB up total "
        "| MB down total | wall s | elapsed s | mean staleness | drops | errors |",
        "|" + " --- |" * 20,
    ]
    for row in comparison.rows:
        hit = row["target"]
        ratios = row["ratios_vs_baseline"]
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{row['label']} ({row['strategy']})"
                    if row["label"] != row["strategy"]
                    else row["label"],
                    "ok" if row["completed"] else row["status"],
                    fmt(row["final_accuracy"], ".4f"),
                    fmt(row["best_accuracy"], ".4f"),
                    fmt(hit["sim_time"], ".1f") if hit["reached"] else "not reached",
                    mb(hit["bytes_up"]) if hit["reached"] else "-",
                    mb(hit["bytes_down"]) if hit["reached"] else "-",
                    mb(hit.get("bytes_total")) if hit["reached"] else "-",
                    fmt(ratios["time_to_target"], ".3f"),
                    fmt(ratios["uplink_bytes_to_target"], ".4f"),
                    fmt(ratios.get("total_bytes_to_target"), ".4f"),
                    fmt(row["aggregations"], "d"),
                    fmt(row["sim_time"], ".1f"),
                    mb(row["total_bytes_up"]),
                    mb(row["total_bytes_down"]),
                    fmt(row["wall_seconds"], ".1f"),
                    fmt(row["elapsed_seconds"], ".1f"),
                    fmt(row["mean_staleness"], ".2f"),
                    _counts(row["drops"]),
                    _counts(row["errors"]),
                ]
            )
            + " |"
        )
    if comparison.metric == "loss":
        lines += loss_table(comparison)
    lines += _staleness_table(comparison)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def loss_table(comparison: Comparison) -> list[str]:
    """Markdown lines for a loss target: test loss, and the simulated time and total
    bytes (up + down) each strategy needed to first reach the target loss."""
    lines = [
        "",
        f"Target test loss: **{fmt(comparison.target, '.4f')}** "
        f"({comparison.scenario.target.describe()}); bytes are up + down.",
        "",
        "| strategy | final loss | best loss | final acc | sim s to target | time ratio "
        "| MB total to target | total-bytes ratio | x fewer total bytes | MB total (run) |",
        "|" + " --- |" * 10,
    ]
    for row in comparison.rows:
        hit, ratios = row["target"], row["ratios_vs_baseline"]
        total_ratio = ratios.get("total_bytes_to_target")
        run_total = (row["total_bytes_up"] or 0) + (row["total_bytes_down"] or 0)
        lines.append(
            "| "
            + " | ".join(
                [
                    row["label"],
                    fmt(row.get("final_loss"), ".4f"),
                    fmt(row.get("best_loss"), ".4f"),
                    fmt(row["final_accuracy"], ".4f"),
                    fmt(hit["sim_time"], ".1f") if hit["reached"] else "not reached",
                    fmt(ratios["time_to_target"], ".3f"),
                    mb(hit.get("bytes_total")) if hit["reached"] else "-",
                    fmt(total_ratio, ".4f"),
                    fmt(1.0 / total_ratio, ".1f") if total_ratio else "-",
                    mb(run_total),
                ]
            )
            + " |"
        )
    return lines


def short_table(comparison: Comparison) -> str:
    """The few numbers a first look needs, one line per strategy: accuracy, simulated
    time and MB up, down and in total to the target (plain text, for the terminal)."""
    head = (
        "strategy",
        "final acc",
        "sim s to target",
        "MB up",
        "MB down",
        "MB total",
        "x baseline time",
        "x baseline bytes",
    )
    rows = [head]
    for row in comparison.rows:
        hit = row["target"]
        reached = bool(hit["reached"])
        rows.append(
            (
                row["label"],
                fmt(row["final_accuracy"], ".4f"),
                fmt(hit["sim_time"], ".1f") if reached else "not reached",
                mb(hit["bytes_up"]) if reached else "-",
                mb(hit["bytes_down"]) if reached else "-",
                mb(hit.get("bytes_total")) if reached else "-",
                fmt(row["ratios_vs_baseline"]["time_to_target"], ".3f"),
                fmt(row["ratios_vs_baseline"].get("total_bytes_to_target"), ".4f"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    target = fmt(comparison.target, ".4f")
    return "\n".join(
        [f"target {comparison.metric} {target} (MB up/down/total: to the target)", *lines]
    )


def _bin_name(lo: int, hi: int | None) -> str:
    return f"{lo}" if hi == lo else f">= {lo}" if hi is None else f"{lo}-{hi}"


def _staleness_table(comparison: Comparison) -> list[str]:
    """Markdown lines: the staleness of the updates each asynchronous run received."""
    rows = [row for row in comparison.rows if row["staleness_histogram"]]
    if not rows:
        return []
    names = [_bin_name(lo, hi) for lo, hi in STALENESS_BINS]
    lines = [
        "",
        "Staleness (model versions between an update's base and its arrival) of every "
        "update the asynchronous runs received, share in each bin:",
        "",
        "| strategy | updates | mean | " + " | ".join(names) + " |",
        "|" + " --- |" * (len(names) + 3),
    ]
    for row in rows:
        counts = staleness_bins(row["staleness_histogram"])
        total = sum(counts)
        shares = [f"{100.0 * c / total:.0f} %" if total else "-" for c in counts]
        lines.append(
            f"| {row['label']} | {total} | {fmt(row['mean_staleness'], '.2f')} | "
            + " | ".join(shares)
            + " |"
        )
    return lines


def plot_staleness(comparison: Comparison, path: Path) -> Path | None:
    """``staleness.png``: the binned staleness histogram of every asynchronous run."""
    rows = [row for row in comparison.rows if row["staleness_histogram"]]
    if not rows:
        return None
    names = [_bin_name(lo, hi) for lo, hi in STALENESS_BINS]
    fig, ax = plt.subplots(figsize=(8.0, 3.6), dpi=110)
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        counts = staleness_bins(row["staleness_histogram"])
        total = sum(counts) or 1
        ax.bar(
            [b + (i - (len(rows) - 1) / 2) * width for b in range(len(names))],
            [c / total for c in counts],
            width=width,
            label=row["label"],
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_xlabel("staleness (model versions)")
    ax.set_ylabel("share of updates")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.suptitle(f"{comparison.scenario.name}: staleness of received updates")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    """``comparison.png``: accuracy vs simulated time and vs cumulative total bytes,
    uplink plus downlink (both axes logarithmic)."""
    return _plot_metric(comparison, path, "accuracy")


def plot_loss(comparison: Comparison, path: Path) -> Path:
    """``loss.png``: test loss vs simulated time and vs cumulative total bytes (up +
    down), both x axes logarithmic, with the target loss."""
    return _plot_metric(comparison, path, "loss")


def _plot_metric(comparison: Comparison, path: Path, metric: str) -> Path:
    """``metric`` (``accuracy`` or ``loss``) of every run against simulated time and
    against cumulative bytes up + down; the target line when it is a ``metric`` target."""
    fig, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=110)
    for result in comparison.results:
        points = [p for p in result.series if math.isfinite(getattr(p, metric))]
        if not points:
            continue
        label = result.label if result.completed else f"{result.label} ({result.status})"
        # Log axes: FedAvg's rounds and the asynchronous runs differ by orders of
        # magnitude; neither can show the evaluation at time 0, before any upload.
        timed = [p for p in points if p.sim_time > 0]
        (line,) = by_time.plot(
            [p.sim_time for p in timed],
            [getattr(p, metric) for p in timed],
            marker="o",
            markersize=2.5,
            label=label,
        )
        sent = [p for p in points if p.bytes_total > 0]
        by_bytes.plot(
            [p.bytes_total for p in sent],
            [getattr(p, metric) for p in sent],
            marker="o",
            markersize=2.5,
            color=line.get_color(),
            label=label,
        )
    for ax, xlabel in (
        (by_time, "simulated time (s, log)"),
        (by_bytes, "cumulative bytes, uplink + downlink (log)"),
    ):
        if comparison.target is not None and comparison.metric == metric:
            ax.axhline(
                comparison.target,
                linestyle="--",
                color="grey",
                linewidth=1,
                label=f"target {comparison.target:.3f}",
            )
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"test {metric}")
        ax.grid(alpha=0.3)
    by_time.legend(loc="lower right" if metric == "accuracy" else "upper right", fontsize=8)
    name = "accuracy" if metric == "accuracy" else "test loss"
    fig.suptitle(f"{comparison.scenario.name}: {name} vs simulated time and total bytes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedsync.simulations.report OUT [--add DOC ...] [--runs DIR --scenario NAME
    --scale F]``: write the reports of a comparison again, with today's tables and
    figures; returns the exit status.

    The runs are those of ``OUT/comparison.json`` (when there is one), of every ``--add``
    document (the same scenario at the same scale, other labels: runs of one scenario
    split across runners), and, for the scenario's other labels, the run folders under
    ``--runs`` (a runner's ``results/``; see :func:`fedsync.simulations.results.read_run`).
    The documents that record a seed must record the same one; it is kept.

    With ``--replace``, an ``--add`` document's row replaces ``OUT``'s row of the same
    label (a row run again); the labels replaced are listed in this rewrite's record and
    leave the earlier blocks that gave them.

    The JSON's ``provenance`` stays that of the runs: ``OUT``'s own block is kept, each
    ``--add`` document's block goes under ``inputs`` (with the labels it gave), and this
    command, its commit and date are appended under ``rewrites``. Rows with no recorded
    provenance (``--runs`` folders, documents without the block) leave the command,
    commit, date and machine unset, for the results pages' manifest to give.
    """
    args = _report_parser().parse_args(argv)
    out = Path(args.out)
    try:
        comparison, sources = _gather(out, args)
    except (OSError, json.JSONDecodeError, ScenarioError, KeyError, TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rewrite = provenance("python -m fedsync.simulations.report", argv)
    origin = sources.provenance({key: rewrite[key] for key in ("command", "commit", "date")})
    for path in write_reports(comparison, out, origin):
        print(f"[report] wrote {path}")
    print(f"\n{short_table(comparison)}")
    return 0


def _report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.simulations.report",
        description="Rewrite comparison.json/.md/.png and staleness.png of a comparison.",
    )
    parser.add_argument("out", help="folder of comparison.json (read when present, written)")
    parser.add_argument(
        "--add", action="append", default=[], help="another comparison.json of the same scenario"
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="rows of the --add documents replace OUT's rows of the same labels (a re-run)",
    )
    parser.add_argument("--runs", help="a runner's results/ folder: one folder per label")
    parser.add_argument("--scenario", help="scenario name (default: the documents')")
    parser.add_argument("--scale", type=float, help="run-length scale (default: the documents')")
    return parser


@dataclass
class _Sources:
    """Where a rewritten comparison's rows came from."""

    own: dict[str, Any] | None = None
    """The ``provenance`` of the document being rewritten (``OUT/comparison.json``)."""
    own_labels: list[str] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """The ``provenance`` of each ``--add`` document, with the ``labels`` it gave."""
    unrecorded: list[str] = field(default_factory=list)
    """Labels whose source records no provenance (``--runs`` folders, older documents)."""
    replaced: list[str] = field(default_factory=list)
    """``OUT``'s labels an ``--add`` document ran again (``--replace``)."""

    def provenance(self, rewrite: Mapping[str, Any]) -> dict[str, Any]:
        """The merged document's ``provenance``: the rewritten document's own (command,
        commit, date, machine) kept when all its rows are accounted for, the ``--add``
        documents' under ``inputs`` and this rewrite (command, commit, date) appended to
        ``rewrites``. When some row's source records nothing, no command, commit, date or
        machine is claimed for the document (the manifest of the results pages has to give
        them) and the rewritten document's own block moves to ``inputs``."""
        own = dict(self.own) if self.own is not None else {}
        inputs = [self._less_replaced(i) for i in own.pop("inputs", [])]
        inputs = [i for i in inputs if not isinstance(i, dict) or i.get("labels") != []]
        rewrites = list(own.pop("rewrites", []))
        if self.replaced:
            rewrite = {**rewrite, "replaced": sorted(self.replaced)}
        if own and self.unrecorded:  # its rows, less those its own inputs gave
            given = {label for i in inputs if isinstance(i, dict) for label in i.get("labels", [])}
            labels = [label for label in self.own_labels if label not in given]
            inputs.insert(0, {**own, "labels": labels})
            own = {}
        inputs += self.inputs
        return {**own, **({"inputs": inputs} if inputs else {}), "rewrites": [*rewrites, rewrite]}

    def _less_replaced(self, given: Any) -> Any:
        """An earlier input's block without the labels this rewrite replaced."""
        if not isinstance(given, dict) or not self.replaced:
            return given
        return {**given, "labels": [x for x in given.get("labels", []) if x not in self.replaced]}


def _gather(out: Path, args: argparse.Namespace) -> tuple[Comparison, _Sources]:
    """The comparison, and where its rows came from."""
    sources = _Sources()
    own = out / "comparison.json"
    documents = [own] if own.is_file() else []
    documents += [Path(path) for path in args.add]
    name, scale = args.scenario, args.scale
    seed: int | None = None
    results: dict[str, RunResult] = {}
    for path in documents:
        document = json.loads(path.read_text(encoding="utf-8"))
        name = name or document.get("scenario")
        scale = scale if scale is not None else float(document.get("scale", 1.0))
        if document.get("scenario") != name or float(document.get("scale", 1.0)) != scale:
            raise ValueError(f"{path}: not scenario {name!r} at scale {scale:g}")
        if document.get("seed") is not None:
            if seed is not None and document["seed"] != seed:
                raise ValueError(f"{path}: seed {document['seed']}, not {seed}")
            seed = int(document["seed"])
        labels = []
        for result in runs_of(document):
            if result.label in results:
                if not (args.replace and path != own and result.label in sources.own_labels):
                    raise ValueError(f"{path}: {result.label!r} is in two documents")
                sources.own_labels.remove(result.label)
                sources.replaced.append(result.label)
            results[result.label] = result
            labels.append(result.label)
        origin = document.get("provenance")
        if not isinstance(origin, dict):
            sources.unrecorded += labels
        elif path == own:
            sources.own, sources.own_labels = origin, labels
        else:
            sources.inputs.append({**origin, "labels": labels})
    if not name:
        raise ValueError("no comparison.json and no --scenario: nothing to report")
    scenario = load_scenario(name)
    if args.runs:
        for spec in scenario.strategies:
            folder = Path(args.runs) / spec.label
            if spec.label not in results and folder.is_dir():
                results[spec.label] = read_run(folder, spec.label, spec.strategy)
                sources.unrecorded.append(spec.label)
    if not results:
        raise ValueError(f"no runs of scenario {name!r} found")
    scenario = scenario.only(results).scaled(1.0 if scale is None else scale)
    scenario = scenario if seed is None else scenario.seeded(seed)
    return build_comparison(scenario, [results[label] for label in scenario.labels]), sources


def write_reports(
    comparison: Comparison, out: Path, origin: Mapping[str, Any] | None = None
) -> list[Path]:
    """Write ``comparison.json``, ``.md`` and ``.png`` into ``out``, and
    ``staleness.png`` when a run was asynchronous. ``origin`` (command, commit, date,
    machine: :func:`fedsync.reports.provenance.provenance`) goes into the JSON as its
    ``provenance``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "comparison.json"
    document = comparison.as_dict()
    if origin is not None:
        document["provenance"] = dict(origin)
    json_path.write_text(json.dumps(document, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    written = [
        json_path,
        write_markdown(comparison, out / "comparison.md"),
        plot_comparison(comparison, out / "comparison.png"),
    ]
    if comparison.metric == "loss":
        written.append(plot_loss(comparison, out / "loss.png"))
    staleness = plot_staleness(comparison, out / "staleness.png")
    return written + ([staleness] if staleness is not None else [])


# --- formatting -------------------------------------------------------------------------------
def fmt(value: Any, spec: str) -> str:
    """``value`` formatted by ``spec``; ``-`` when it is missing or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def mb(value: Any) -> str:
    """A byte count in MB (three decimals); ``-`` when it is missing."""
    return "-" if value is None else f"{int(value) / 1e6:.3f}"


def _counts(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "0"
    return ", ".join(f"{key} {value}" for key, value in counts.items())


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Iterable):
        return list(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
