"""Compare strategies on one scenario through the real Flower app.

::

    python -m simulations.compare digits-stragglers --out results/compare/digits
    python -m simulations.compare fmnist-ci --only teasq,fedavg --verbose
    python -m simulations.compare fmnist-teasq --scale 0.25   # a quarter of every budget

Every strategy of the scenario (:mod:`simulations.scenario`) runs as its own
``flwr run`` on one ``flower-superlink --simulation`` (Flower's simulation engine),
started for the comparison and stopped at its end by process id. Each run writes
``summary.json`` into its own results folder; once all are done the target accuracy is
fixed (absolute, or a fraction of the best final accuracy), and the simulated time and
bytes each strategy needed to first reach it are read off its evaluation series -- the
same series for every strategy, so the numbers compare like for like, whatever target
the runs themselves were given.

Written into ``--out``: ``comparison.json``, ``comparison.md`` and ``comparison.png``
(accuracy against simulated time, and against cumulative uplink bytes). The SuperLink's
folder (database, logs, every run's events and summary) goes to ``--run-dir``.
The exit status is non-zero unless every run finished as ``finished:completed``
(``flwr run --stream`` itself exits 0 on failure; the status is read from the SuperLink).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: CI, SSH
import matplotlib.pyplot as plt

from fedsync.deploy import DeploymentError, LocalSuperLink
from fedsync.reports import read_events
from simulations.scenario import PROJECT_ROOT, Scenario, ScenarioError, load_scenario

__all__ = [
    "Comparison",
    "ComparisonRunner",
    "EvalPoint",
    "RunResult",
    "build_comparison",
    "first_reaching",
    "main",
    "ratio",
    "read_series",
    "staleness_bins",
]

COMPLETED = "finished:completed"
"""The SuperLink's status of a run whose ServerApp returned normally."""


# --- what one run produced ------------------------------------------------------------------
@dataclass(frozen=True)
class EvalPoint:
    """One central evaluation of the global model, with what it cost so far."""

    sim_time: float
    bytes_up: int
    bytes_down: int
    accuracy: float

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> EvalPoint:
        """Read an evaluation entry (``summary.json`` or an ``evaluation`` event)."""
        return cls(
            sim_time=float(entry.get("sim_time", math.nan)),
            bytes_up=int(entry.get("cumulative_bytes_up", 0)),
            bytes_down=int(entry.get("cumulative_bytes_down", 0)),
            accuracy=float(entry.get("accuracy", math.nan)),
        )

    def as_list(self) -> list[float | int]:
        """``[sim_time, bytes_up, bytes_down, accuracy]`` (compact, for the JSON)."""
        return [self.sim_time, self.bytes_up, self.bytes_down, self.accuracy]


def read_series(summary: Mapping[str, Any], events_path: Path | None = None) -> list[EvalPoint]:
    """The evaluation series of a run, in time order.

    FedAvg's summary lists them as ``rounds``, the asynchronous strategies' as
    ``evaluations``; a summary without either falls back to the ``evaluation`` events
    of ``events.jsonl``.
    """
    entries = summary.get("evaluations") or summary.get("rounds")
    if not entries and events_path is not None and events_path.is_file():
        entries = list(read_events(events_path, "evaluation"))
    points = [EvalPoint.from_entry(entry) for entry in entries or []]
    return sorted(points, key=lambda p: (p.sim_time, p.bytes_up))


def first_reaching(series: Sequence[EvalPoint], target: float | None) -> EvalPoint | None:
    """The first evaluation whose accuracy is at least ``target`` (``None``: never)."""
    if target is None:
        return None
    for point in series:
        if point.accuracy >= target:
            return point
    return None


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``; ``None`` when either is missing or the baseline is 0.

    Below 1 the strategy needed less than the baseline.
    """
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


@dataclass
class RunResult:
    """How one strategy's run went.

    Attributes
    ----------
    label, strategy : str
        The scenario's label and the ``strategy`` run-config value.
    status : str
        The SuperLink's status (``finished:completed`` ...), or why there is none.
    elapsed_seconds : float
        Real seconds from submission to the end of the stream (start-up included).
    summary : dict
        The run's ``summary.json`` (empty if it wrote none).
    series : list of EvalPoint
        Its evaluations.
    details : str
        The SuperLink's status details or the error.
    """

    label: str
    strategy: str
    status: str
    elapsed_seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    series: list[EvalPoint] = field(default_factory=list)
    details: str = ""

    @property
    def completed(self) -> bool:
        """Finished normally and left a summary to compare."""
        return self.status == COMPLETED and bool(self.summary)


# --- the comparison ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """Everything ``comparison.json`` holds; :meth:`as_dict` is that file."""

    scenario: Scenario
    target: float | None
    rows: list[dict[str, Any]]
    results: list[RunResult]

    @property
    def all_completed(self) -> bool:
        """Whether every strategy's run completed."""
        return bool(self.results) and all(r.completed for r in self.results)

    def row(self, label: str) -> dict[str, Any]:
        """The row of one strategy."""
        for row in self.rows:
            if row["label"] == label:
                return row
        raise KeyError(label)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document."""
        scenario = self.scenario
        return {
            "scenario": scenario.name,
            "description": scenario.description,
            "target_rule": {"kind": scenario.target.kind, "value": scenario.target.value},
            "target_accuracy": self.target,
            "baseline": scenario.baseline,
            "scale": scenario.scale,
            "federation": dict(scenario.federation),
            "all_completed": self.all_completed,
            "strategies": self.rows,
        }


def build_comparison(scenario: Scenario, results: Sequence[RunResult]) -> Comparison:
    """Fix the target, find when and at what cost each run reached it, and the ratios.

    Parameters
    ----------
    scenario : Scenario
        Its target rule and baseline label are used.
    results : sequence of RunResult
        One per strategy run (failed ones included: they get a row that says so).
    """
    target = scenario.target.resolve(_final_accuracy(r) for r in results if r.completed)
    reached = {r.label: first_reaching(r.series, target) for r in results}
    base = reached.get(scenario.baseline)
    rows = []
    for result in results:
        hit = reached[result.label]
        summary = result.summary
        rows.append(
            {
                "label": result.label,
                "strategy": result.strategy,
                "status": result.status,
                "completed": result.completed,
                "details": result.details[-2000:] if not result.completed else "",
                "final_accuracy": _final_accuracy(result),
                "best_accuracy": summary.get("best_accuracy"),
                "target": {
                    "accuracy": target,
                    "reached": hit is not None,
                    "sim_time": hit.sim_time if hit else None,
                    "bytes_up": hit.bytes_up if hit else None,
                    "bytes_down": hit.bytes_down if hit else None,
                },
                "ratios_vs_baseline": {
                    "time_to_target": ratio(
                        hit.sim_time if hit else None, base.sim_time if base else None
                    ),
                    "uplink_bytes_to_target": ratio(
                        hit.bytes_up if hit else None, base.bytes_up if base else None
                    ),
                    "downlink_bytes_to_target": ratio(
                        hit.bytes_down if hit else None, base.bytes_down if base else None
                    ),
                },
                "sim_time": summary.get("sim_time"),
                "total_bytes_up": summary.get("total_bytes_up"),
                "total_bytes_down": summary.get("total_bytes_down"),
                "wall_seconds": summary.get("wall_seconds"),
                "elapsed_seconds": round(result.elapsed_seconds, 3),
                "staleness_histogram": summary.get("staleness_histogram", {}),
                "mean_staleness": summary.get("mean_staleness"),
                "drops": summary.get("drops", {}),
                "errors": summary.get("errors", {}),
                "stop_reason": summary.get("stop_reason", ""),
                "aggregations": summary.get("aggregations", summary.get("num_rounds")),
                "run_target": summary.get("target"),
                # [sim_time, cumulative bytes up, cumulative bytes down, accuracy]
                "evaluations": [p.as_list() for p in result.series],
            }
        )
    return Comparison(scenario, target, rows, list(results))


def _final_accuracy(result: RunResult) -> float | None:
    value = result.summary.get("final_accuracy")
    if value is None and result.series:
        value = result.series[-1].accuracy
    return None if value is None else float(value)


# --- reports ----------------------------------------------------------------------------------
def write_markdown(comparison: Comparison, path: Path) -> Path:
    """``comparison.md``: the target and one table row per strategy."""
    scenario = comparison.scenario
    target = comparison.target
    lines = [
        f"# {scenario.name}",
        "",
        scenario.description,
        "",
        f"Target: {scenario.target.describe()} = **{_fmt(target, '.4f')}**. "
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
    lines += [
        "| strategy | status | final acc | best acc | sim s to target | MB up to target "
        "| MB down to target | time ratio | uplink ratio | rounds / aggregations "
        "| sim s total | MB up total | wall s | elapsed s | mean staleness | drops | errors |",
        "|" + " --- |" * 17,
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
                    _fmt(row["final_accuracy"], ".4f"),
                    _fmt(row["best_accuracy"], ".4f"),
                    _fmt(hit["sim_time"], ".1f") if hit["reached"] else "not reached",
                    _mb(hit["bytes_up"]) if hit["reached"] else "-",
                    _mb(hit["bytes_down"]) if hit["reached"] else "-",
                    _fmt(ratios["time_to_target"], ".3f"),
                    _fmt(ratios["uplink_bytes_to_target"], ".4f"),
                    _fmt(row["aggregations"], "d"),
                    _fmt(row["sim_time"], ".1f"),
                    _mb(row["total_bytes_up"]),
                    _fmt(row["wall_seconds"], ".1f"),
                    _fmt(row["elapsed_seconds"], ".1f"),
                    _fmt(row["mean_staleness"], ".2f"),
                    _counts(row["drops"]),
                    _counts(row["errors"]),
                ]
            )
            + " |"
        )
    lines += _staleness_table(comparison)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


STALENESS_BINS: tuple[tuple[int, int | None], ...] = (
    (0, 0),
    (1, 1),
    (2, 2),
    (3, 4),
    (5, 8),
    (9, 16),
    (17, 32),
    (33, None),
)
"""Staleness bins of the report (inclusive; ``None``: no upper end)."""


def staleness_bins(histogram: Mapping[str, int] | Mapping[int, int]) -> list[int]:
    """Counts of a ``{staleness: count}`` histogram in :data:`STALENESS_BINS`."""
    counts = [0] * len(STALENESS_BINS)
    for key, count in histogram.items():
        tau = int(key)
        for i, (lo, hi) in enumerate(STALENESS_BINS):
            if tau >= lo and (hi is None or tau <= hi):
                counts[i] += int(count)
                break
    return counts


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
            f"| {row['label']} | {total} | {_fmt(row['mean_staleness'], '.2f')} | "
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
    """``comparison.png``: accuracy vs simulated time and vs cumulative uplink bytes
    (both axes logarithmic)."""
    fig, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=110)
    for result in comparison.results:
        if not result.series:
            continue
        label = result.label if result.completed else f"{result.label} ({result.status})"
        # Log axes: FedAvg's rounds and the asynchronous runs differ by orders of
        # magnitude; neither can show the evaluation at time 0, before any upload.
        timed = [(p.sim_time, p.accuracy) for p in result.series if p.sim_time > 0]
        (line,) = by_time.plot(
            [t for t, _ in timed],
            [a for _, a in timed],
            marker="o",
            markersize=2.5,
            label=label,
        )
        sent = [(p.bytes_up, p.accuracy) for p in result.series if p.bytes_up > 0]
        by_bytes.plot(
            [b for b, _ in sent],
            [a for _, a in sent],
            marker="o",
            markersize=2.5,
            color=line.get_color(),
            label=label,
        )
    for ax, xlabel in (
        (by_time, "simulated time (s, log)"),
        (by_bytes, "cumulative uplink bytes (log)"),
    ):
        if comparison.target is not None:
            ax.axhline(
                comparison.target,
                linestyle="--",
                color="grey",
                linewidth=1,
                label=f"target {comparison.target:.3f}",
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    by_time.set_xscale("log")
    by_bytes.set_xscale("log")
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{comparison.scenario.name}: accuracy vs simulated time and uplink bytes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_reports(comparison: Comparison, out: Path) -> list[Path]:
    """Write ``comparison.json``, ``.md`` and ``.png`` into ``out``, and
    ``staleness.png`` when a run was asynchronous."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "comparison.json"
    json_path.write_text(
        json.dumps(comparison.as_dict(), indent=2, default=_jsonable) + "\n", encoding="utf-8"
    )
    written = [
        json_path,
        write_markdown(comparison, out / "comparison.md"),
        plot_comparison(comparison, out / "comparison.png"),
    ]
    staleness = plot_staleness(comparison, out / "staleness.png")
    return written + ([staleness] if staleness is not None else [])


# --- running ----------------------------------------------------------------------------------
class ComparisonRunner:
    """Runs every strategy of a scenario on one simulation SuperLink.

    Parameters
    ----------
    scenario : Scenario
        What to run.
    run_dir : pathlib.Path
        The SuperLink's folder (``FLWR_HOME``, database, logs) and ``results/<label>/``
        of each run.
    project_root : pathlib.Path
        The Flower app ``flwr run`` submits.
    verbose : bool
        Stream every run's log to stdout.
    say : callable
        Where progress lines go.
    """

    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        *,
        project_root: Path = PROJECT_ROOT,
        verbose: bool = False,
        say: Callable[[str], None] = print,
    ) -> None:
        self.scenario = scenario
        self.run_dir = run_dir.resolve()
        self.results_dir = self.run_dir / "results"
        self.project_root = project_root
        self.verbose = verbose
        self.say = say
        self.started_pids: list[int] = []
        """Process (group) ids this runner started: the SuperLink and what it spawned."""

    def run(self) -> list[RunResult]:
        """Run each strategy in turn; the SuperLink is stopped however it ends."""
        # Event logs are appended to: a second comparison in the same folder would mix
        # its events with the first one's.
        taken = [s.label for s in self.scenario.strategies if (self.results_dir / s.label).exists()]
        if taken:
            raise FileExistsError(
                f"{self.results_dir} already holds results of {taken}: use a new run folder"
            )
        link = LocalSuperLink(self.run_dir / "superlink", simulation=True)
        results: list[RunResult] = []
        link.start()
        if link.process is not None:
            self.started_pids.append(link.process.pid)
        try:
            for spec in self.scenario.strategies:
                result = self._run_one(link, spec.label)
                results.append(result)
                self.say(_progress_line(result, len(results), len(self.scenario.strategies)))
                if result.status == "timeout":
                    # The run may still hold the simulation engine; later runs would
                    # queue behind it and time out too.
                    self.say("[compare] stopping: a run timed out")
                    break
        finally:
            link.stop()
        return results

    def _run_one(self, link: LocalSuperLink, label: str) -> RunResult:
        spec = self.scenario.strategy(label)
        run_config = {
            **spec.run_config,
            "results-dir": str(self.results_dir),
            "run-name": label,
        }
        started = time.monotonic()
        try:
            outcome = link.run_app(
                self.project_root,
                run_config,
                federation_config=self.scenario.federation,
                timeout=self.scenario.timeout,
                echo=self.verbose,
            )
        except DeploymentError as err:
            elapsed = time.monotonic() - started
            status = "timeout" if elapsed >= self.scenario.timeout else "not-started"
            return RunResult(label, spec.strategy, status, elapsed, details=str(err))
        elapsed = time.monotonic() - started
        folder = self.results_dir / label
        summary = _read_json(folder / "summary.json")
        return RunResult(
            label,
            spec.strategy,
            outcome.status,
            elapsed,
            summary=summary,
            series=read_series(summary, folder / "events.jsonl"),
            details=outcome.details if outcome.completed else _tail(outcome.output),
        )


def _progress_line(result: RunResult, done: int, total: int) -> str:
    elapsed = f"{result.elapsed_seconds:.1f} s"
    head = f"[compare] {done}/{total} {result.label}: {result.status} in {elapsed}"
    if not result.completed:
        return f"{head} -- {result.details.strip().splitlines()[-1] if result.details else ''}"
    summary = result.summary
    return (
        f"{head}, final accuracy {_fmt(summary.get('final_accuracy'), '.4f')}, "
        f"sim {_fmt(summary.get('sim_time'), '.1f')} s, up {_mb(summary.get('total_bytes_up'))} MB"
    )


# --- the command line -------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simulations.compare SCENARIO [--out DIR] [--only a,b] [--scale F]
    [--run-dir DIR] [--verbose]``; returns the exit status."""
    args = _parser().parse_args(argv)
    # SIGTERM (what kill and CI runners send; a job started in the background even
    # ignores SIGINT) must still reach the runner's ``finally``, which stops the
    # SuperLink and everything it spawned.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        scenario = load_scenario(args.scenario)
        if args.only:
            scenario = scenario.only(args.only.split(","))
        scenario = scenario.scaled(args.scale)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or f"results/compare/{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = out.resolve()
    run_dir = Path(args.run_dir).resolve() if args.run_dir else _default_run_dir(out, scenario)
    print(
        f"[compare] {scenario.name}: {', '.join(scenario.labels)}; "
        f"reports in {out}, runs in {run_dir}",
        flush=True,
    )
    runner = ComparisonRunner(
        scenario, run_dir, verbose=args.verbose, say=lambda line: print(line, flush=True)
    )
    try:
        results = runner.run()
    except FileExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    comparison = build_comparison(scenario, results)
    for path in write_reports(comparison, out):
        print(f"[compare] wrote {path}")
    print((out / "comparison.md").read_text(encoding="utf-8"))
    missing = [s.label for s in scenario.strategies if s.label not in {r.label for r in results}]
    if not comparison.all_completed or missing:
        failed = [r.label for r in results if not r.completed] + missing
        print(f"[compare] did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    print(f"[compare] signal {signum}: stopping the SuperLink", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.compare",
        description="Run every strategy of a scenario through the real Flower app and compare.",
    )
    parser.add_argument("scenario", help="scenario name (simulations/scenarios) or .toml path")
    parser.add_argument("--out", help="folder for comparison.json/.md/.png")
    parser.add_argument(
        "--only", help="comma-separated strategy labels to run (default: all)", default=""
    )
    parser.add_argument(
        "--run-dir",
        help="folder for the SuperLink and each run's results "
        "(default: OUT/runs, or runs/compare/<scenario> when OUT is inside the app folder)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every run's num-rounds / max-aggregations / max-tasks (a cheaper run)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream every run's log")
    return parser


def _default_run_dir(out: Path, scenario: Scenario) -> Path:
    # flwr run packs every .json/.jsonl/.toml under the app folder that .gitignore does
    # not exclude into the app bundle (10 MB cap): keep event logs and the SuperLink's
    # FLWR_HOME out of a reports folder that lives in the project, under runs/ instead.
    if out.is_relative_to(PROJECT_ROOT):
        return (
            PROJECT_ROOT / "runs" / "compare" / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    return out / "runs"


# --- small helpers ----------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _mb(value: Any) -> str:
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
