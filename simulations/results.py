"""What the runs of a comparison produced, and what it concludes from them.

A run's evaluation series (:class:`EvalPoint`, read from its ``summary.json`` or its
``events.jsonl`` by :func:`read_series`), how the run went (:class:`RunResult`), and the
comparison of all runs (:func:`build_comparison`): the target accuracy fixed after every
run is done, when and at what cost each run first reached it (and its smoothed curve,
:func:`smoothed_reaching`), and the ratios against the baseline. No plotting and no
processes here: :mod:`fedsync.simulations.report` writes the files,
:mod:`fedsync.simulations.compare` runs the strategies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedsync.reports import RunSummary, read_events
from fedsync.simulations.scenario import Scenario, ScenarioError, load_scenario

__all__ = [
    "COMPLETED",
    "SMOOTHING_WINDOW",
    "STALENESS_BINS",
    "Comparison",
    "EvalPoint",
    "RunResult",
    "build_comparison",
    "evaluation_entries",
    "first_reaching",
    "first_reaching_loss",
    "load_comparison",
    "ratio",
    "read_run",
    "read_series",
    "runs_of",
    "smoothed_reaching",
    "staleness_bins",
]

COMPLETED = "finished:completed"
"""The SuperLink's status of a run whose ServerApp returned normally."""

SMOOTHING_WINDOW = 3
"""Evaluations in the trailing moving average of the smoothed target crossing
(:func:`smoothed_reaching`): one evaluation that happens to land above the target does not
count, the mean of this many consecutive ones has to."""


# --- what one run produced ------------------------------------------------------------------
@dataclass(frozen=True)
class EvalPoint:
    """One central evaluation of the global model, with what it cost so far."""

    sim_time: float
    bytes_up: int
    bytes_down: int
    accuracy: float
    loss: float = math.nan

    @property
    def bytes_total(self) -> int:
        """Cumulative bytes both ways (uplink + downlink)."""
        return self.bytes_up + self.bytes_down

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> EvalPoint:
        """Read an evaluation entry (``summary.json`` or an ``evaluation`` event)."""
        return cls(
            sim_time=float(entry.get("sim_time", math.nan)),
            bytes_up=int(entry.get("cumulative_bytes_up", 0)),
            bytes_down=int(entry.get("cumulative_bytes_down", 0)),
            accuracy=float(entry.get("accuracy", math.nan)),
            loss=float(entry.get("loss", math.nan)),
        )

    def as_list(self) -> list[float | int]:
        """``[sim_time, bytes_up, bytes_down, accuracy, loss]`` (compact, for the JSON)."""
        return [self.sim_time, self.bytes_up, self.bytes_down, self.accuracy, self.loss]


def evaluation_entries(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The evaluation entries of a run's ``summary.json``, in the order written (every
    strategy writes the same :class:`~fedsync.reports.RunSummary`)."""
    return RunSummary.evaluations(summary)


def read_series(summary: Mapping[str, Any], events_path: Path | None = None) -> list[EvalPoint]:
    """The evaluation series of a run, in time order.

    From the summary's entries (:func:`evaluation_entries`); a summary without any
    falls back to the ``evaluation`` events of ``events.jsonl``.
    """
    entries = evaluation_entries(summary)
    if not entries and events_path is not None and events_path.is_file():
        entries = list(read_events(events_path, "evaluation"))
    points = [EvalPoint.from_entry(entry) for entry in entries]
    return sorted(points, key=lambda p: (p.sim_time, p.bytes_up))


def first_reaching(series: Sequence[EvalPoint], target: float | None) -> EvalPoint | None:
    """The first evaluation whose accuracy is at least ``target`` (``None``: never)."""
    if target is None:
        return None
    for point in series:
        if point.accuracy >= target:
            return point
    return None


def first_reaching_loss(series: Sequence[EvalPoint], target: float | None) -> EvalPoint | None:
    """The first evaluation whose test loss is at most ``target`` (``None``: never)."""
    if target is None:
        return None
    for point in series:
        if point.loss <= target:
            return point
    return None


def smoothed_reaching(
    series: Sequence[EvalPoint],
    target: float | None,
    metric: Literal["accuracy", "loss"] = "accuracy",
    window: int = SMOOTHING_WINDOW,
) -> EvalPoint | None:
    """The first evaluation at which the trailing mean of ``metric`` reaches ``target``.

    The mean is over that evaluation and the ``window - 1`` before it, so it exists from
    the ``window``-th evaluation on (a shorter series never reaches the target). Reaching
    is at least ``target`` for accuracy, at most for loss; ``None``: never.
    """
    if target is None:
        return None
    values = [getattr(point, metric) for point in series]
    for i in range(window - 1, len(series)):
        mean = math.fsum(values[i - window + 1 : i + 1]) / window
        if (mean >= target) if metric == "accuracy" else (mean <= target):
            return series[i]
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
    def metric(self) -> str:
        """What :attr:`target` is: ``"accuracy"``, or ``"loss"`` (lower is better)."""
        return self.scenario.target.metric

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
            "target_metric": self.metric,
            "target_accuracy": self.target if self.metric == "accuracy" else None,
            "target_loss": self.target if self.metric == "loss" else None,
            "baseline": scenario.baseline,
            "scale": scenario.scale,
            "seed": scenario.seed,
            "smoothing_window": SMOOTHING_WINDOW,
            "federation": dict(scenario.federation),
            "all_completed": self.all_completed,
            "strategies": self.rows,
        }


def _own_federation(scenario: Scenario, label: str) -> bool:
    """Whether strategy ``label`` runs on a federation of its own (a row that is no
    longer in the scenario, read from an older report, has none)."""
    return label in scenario.labels and bool(scenario.strategy(label).federation)


def build_comparison(scenario: Scenario, results: Sequence[RunResult]) -> Comparison:
    """Fix the target, find when and at what cost each run reached it, and the ratios.

    Parameters
    ----------
    scenario : Scenario
        Its target rule and baseline label are used.
    results : sequence of RunResult
        One per strategy run (failed ones included: they get a row that says so).
    """
    rule = scenario.target
    if rule.is_loss:
        baseline = [r for r in results if r.label == scenario.baseline and r.completed]
        target = rule.resolve_loss(_final_loss(baseline[0]) if baseline else None)
        reached = {r.label: first_reaching_loss(r.series, target) for r in results}
    else:
        target = rule.resolve(_final_accuracy(r) for r in results if r.completed)
        reached = {r.label: first_reaching(r.series, target) for r in results}
    base = reached.get(scenario.baseline)
    rows = []
    for result in results:
        hit = reached[result.label]
        smooth = smoothed_reaching(result.series, target, rule.metric)
        summary = result.summary
        rows.append(
            {
                "label": result.label,
                "strategy": result.strategy,
                **(
                    {"federation": scenario.federation_of(result.label)}
                    if _own_federation(scenario, result.label)
                    else {}
                ),
                "status": result.status,
                "completed": result.completed,
                "details": result.details[-2000:] if not result.completed else "",
                "final_accuracy": _final_accuracy(result),
                "best_accuracy": summary.get("best_accuracy"),
                "final_loss": _final_loss(result),
                "best_loss": _best_loss(result),
                "target": {
                    "metric": rule.metric,
                    "accuracy": None if rule.is_loss else target,
                    "loss": target if rule.is_loss else None,
                    "reached": hit is not None,
                    "sim_time": hit.sim_time if hit else None,
                    "bytes_up": hit.bytes_up if hit else None,
                    "bytes_down": hit.bytes_down if hit else None,
                    "bytes_total": hit.bytes_total if hit else None,
                },
                # The same target, crossed by the smoothed curve (SMOOTHING_WINDOW).
                "target_smoothed": {
                    "reached": smooth is not None,
                    "sim_time": smooth.sim_time if smooth else None,
                    "bytes_total": smooth.bytes_total if smooth else None,
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
                    "total_bytes_to_target": ratio(
                        hit.bytes_total if hit else None, base.bytes_total if base else None
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
                "downlink": _downlink_of(summary),
                # [sim_time, cumulative bytes up, cumulative bytes down, accuracy, loss]
                "evaluations": [p.as_list() for p in result.series],
            }
        )
    return Comparison(scenario, target, rows, list(results))


def _downlink_of(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """What an engine run's downlink sent, from its ``summary.json``: tasks, resyncs, the
    broadcast figure (a shared downlink's) and the encoder's own account (payloads by
    kind, why whole models went out); ``None`` for a run without one (FedAvg)."""
    account = summary.get("downlink_shared") or summary.get("downlink")
    if not isinstance(account, Mapping):
        return None
    return {
        **{field: summary.get(key) for field, key in _DOWNLINK_FIELDS.items()},
        "shared": "downlink_shared" in summary,
        **account,
    }


_DOWNLINK_FIELDS = {
    "tasks": "tasks",
    "resyncs": "downlink_resyncs",
    "bytes_down_broadcast": "total_bytes_down_broadcast",
}
"""A row's ``downlink`` fields taken from the summary's top level, by their summary key."""


def _downlink_summary(downlink: Mapping[str, Any]) -> dict[str, Any]:
    """The summary fields a row's ``downlink`` (:func:`_downlink_of`) was drawn from."""
    fields = {key: downlink.get(field) for field, key in _DOWNLINK_FIELDS.items()}
    account = {k: v for k, v in downlink.items() if k not in _DOWNLINK_FIELDS and k != "shared"}
    return {**fields, ("downlink_shared" if downlink.get("shared") else "downlink"): account}


def read_run(folder: Path, label: str, strategy: str) -> RunResult:
    """A run's result from its folder alone (``summary.json``, ``events.jsonl``), for a
    comparison whose runner did not finish (stopped, or its runs split across runners).

    The ServerApp writes ``summary.json`` when the run ends normally, so a summary with a
    stop reason counts as completed; the runner's elapsed time (start-up included) is not
    in the folder, and the run's own wall seconds stand in for it.
    """
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        summary = {}
    if not isinstance(summary, dict):
        summary = {}
    done = bool(summary.get("stop_reason"))
    return RunResult(
        label,
        strategy,
        COMPLETED if done else "no-summary",
        float(summary.get("wall_seconds") or 0.0),
        summary=summary if done else {},
        series=read_series(summary, folder / "events.jsonl"),
    )


_SUMMARY_KEYS = (
    "final_accuracy",
    "best_accuracy",
    "sim_time",
    "total_bytes_up",
    "total_bytes_down",
    "wall_seconds",
    "staleness_histogram",
    "mean_staleness",
    "drops",
    "errors",
    "stop_reason",
    "aggregations",
)


def runs_of(document: Mapping[str, Any]) -> list[RunResult]:
    """The runs a ``comparison.json`` document was drawn from, rebuilt from its rows.

    Every row keeps the summary fields the comparison reads and the run's evaluation
    series, so :func:`build_comparison` draws the same target and rows from them.

    Raises
    ------
    ScenarioError
        If the document has no strategies.
    """
    rows = document.get("strategies")
    if not isinstance(rows, list) or not rows:
        raise ScenarioError("comparison document has no strategies")
    results = []
    for row in rows:
        summary = {key: row[key] for key in _SUMMARY_KEYS if row.get(key) is not None}
        if row.get("run_target") is not None:
            summary["target"] = row["run_target"]
        if row.get("downlink") is not None:
            summary.update(_downlink_summary(row["downlink"]))
        series = [  # four numbers per point before losses were kept, five since
            EvalPoint(float(t), int(up), int(down), float(acc), *(float(x) for x in loss[:1]))
            for t, up, down, acc, *loss in row.get("evaluations", [])
        ]
        results.append(
            RunResult(
                str(row["label"]),
                str(row["strategy"]),
                str(row["status"]),
                float(row.get("elapsed_seconds") or 0.0),
                summary=summary if row.get("completed") else {},
                series=series,
                details=str(row.get("details", "")),
            )
        )
    return results


def load_comparison(document: Mapping[str, Any]) -> Comparison:
    """The comparison a ``comparison.json`` document was written from, rebuilt (with
    whatever :func:`build_comparison` computes today): the reports of a finished
    comparison can be written again without running anything. The scenario is loaded by
    name and cut to the rows' labels at the document's scale and seed (the scenario's own
    seed when the document records none).

    Raises
    ------
    ScenarioError
        If the document has no strategies, or its scenario or a label is unknown.
    """
    results = runs_of(document)
    scenario = load_scenario(str(document.get("scenario", "")))
    scenario = scenario.only(r.label for r in results)
    scenario = scenario.scaled(float(document.get("scale", 1.0)))
    if document.get("seed") is not None:
        scenario = scenario.seeded(int(document["seed"]))
    return build_comparison(scenario, results)


def _final_accuracy(result: RunResult) -> float | None:
    value = result.summary.get("final_accuracy")
    if value is None and result.series:
        value = result.series[-1].accuracy
    return None if value is None else float(value)


def _final_loss(result: RunResult) -> float | None:
    value = result.summary.get("final_loss")
    if value is None and result.series:
        value = result.series[-1].loss
    return None if value is None else float(value)


def _best_loss(result: RunResult) -> float | None:
    losses = [p.loss for p in result.series if math.isfinite(p.loss)]
    return min(losses) if losses else None


# --- staleness ------------------------------------------------------------------------------
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
