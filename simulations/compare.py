"""Compare strategies on one scenario through the real Flower app.

::

    python -m fedsync.simulations.compare digits-stragglers --out results/compare/digits
    python -m fedsync.simulations.compare fmnist-ci --only teasq,fedavg --verbose
    python -m fedsync.simulations.compare fmnist-teasq --scale 0.25   # a quarter of every budget
    python -m fedsync.simulations.compare fmnist-ci --seed 1 --out results/compare/ci-seed1

Every strategy of the scenario (:mod:`fedsync.simulations.scenario`) runs as its own
``flwr run`` on one ``flower-superlink --simulation`` (Flower's simulation engine),
started for the comparison and stopped at its end by process id. Each run writes
``summary.json`` into its own results folder; once all are done the target accuracy is
fixed (absolute, or a fraction of the best final accuracy), and the simulated time and
bytes each strategy needed to first reach it are read off its evaluation series -- the
same series for every strategy, so the numbers compare like for like, whatever target
the runs themselves were given. ``--seed`` runs every strategy with another run-config
``seed`` (data split, fleet assignment, initial model), recorded in ``comparison.json``;
:mod:`fedsync.simulations.seeds` draws the spread over several seeds' comparisons.

This module runs the strategies and is the command line; what the runs produced and
the comparison drawn from them are :mod:`fedsync.simulations.results`, the files written from
it :mod:`fedsync.simulations.report`. Written into ``--out``: ``comparison.json``,
``comparison.md``, ``comparison.png`` (accuracy against simulated time, and against
cumulative total bytes, up + down) and, when a run was asynchronous, ``staleness.png``. The
SuperLink's folder (database, logs, every run's events and summary) goes to
``--run-dir``. The exit status is non-zero unless every run finished as
``finished:completed`` (``flwr run --stream`` itself exits 0 on failure; the status is
read from the SuperLink).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedsync.aggregation.health import DIVERGED_EXIT, health_problem
from fedsync.deploy import DeploymentError, LocalSuperLink
from fedsync.reports.provenance import provenance
from fedsync.simulations.cleanup import stop_superlink
from fedsync.simulations.progress import ComparisonProgress, budget_of
from fedsync.simulations.report import fmt, mb, short_table, write_reports
from fedsync.simulations.results import RunResult, build_comparison, read_series
from fedsync.simulations.scenario import PROJECT_ROOT, Scenario, ScenarioError, load_scenario

__all__ = ["ComparisonRunner", "main"]


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
    progress : bool or None
        Draw progress bars (per strategy and overall); default: only at a terminal
        outside CI (:func:`fedsync.simulations.progress.interactive`).
    """

    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        *,
        project_root: Path = PROJECT_ROOT,
        verbose: bool = False,
        say: Callable[[str], None] = print,
        progress: bool | None = None,
    ) -> None:
        self.scenario = scenario
        self.run_dir = run_dir.resolve()
        self.results_dir = self.run_dir / "results"
        self.project_root = project_root
        self.verbose = verbose
        self.say = say
        self.progress = progress
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
        budgets = {s.label: budget_of(s.run_config) for s in self.scenario.strategies}
        # Streaming every run's log and drawing bars would fight over the terminal.
        bars = ComparisonProgress(budgets, enabled=False if self.verbose else self.progress)
        try:
            with bars:
                for spec in self.scenario.strategies:
                    bars.watch(spec.label, self.results_dir / spec.label / "events.jsonl")
                    result = self._run_one(link, spec.label)
                    bars.finish(spec.label, result.status)
                    results.append(result)
                    self.say(_progress_line(result, len(results), len(self.scenario.strategies)))
                    if result.status == "timeout":
                        # The run may still hold the simulation engine; later runs would
                        # queue behind it and time out too.
                        self.say("[compare] stopping: a run timed out")
                        break
        finally:
            stop_superlink(link)
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
                federation_config=self.scenario.federation_of(label),
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
        f"{head}, final accuracy {fmt(summary.get('final_accuracy'), '.4f')}, "
        f"sim {fmt(summary.get('sim_time'), '.1f')} s, up {mb(summary.get('total_bytes_up'))} MB"
    )


# --- the command line -------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedsync.simulations.compare SCENARIO [--out DIR] [--only a,b] [--scale F]
    [--seed N] [--run-dir DIR] [--verbose]``; returns the exit status."""
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
        if args.seed is not None:
            scenario = scenario.seeded(args.seed)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or f"results/compare/{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = out.resolve()
    run_dir = Path(args.run_dir).resolve() if args.run_dir else _default_run_dir(out, scenario)
    print(
        f"[compare] {scenario.name} (seed {scenario.seed}): {', '.join(scenario.labels)}; "
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
    origin = provenance("python -m fedsync.simulations.compare", argv)
    for path in write_reports(comparison, out, origin):
        print(f"[compare] wrote {path}")
    print(f"\n{short_table(comparison)}\n")
    print(f"[compare] figure: {out / 'comparison.png'}; full table: {out / 'comparison.md'}")
    missing = [s.label for s in scenario.strategies if s.label not in {r.label for r in results}]
    if not comparison.all_completed or missing:
        failed = [r.label for r in results if not r.completed] + missing
        print(f"[compare] did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    unhealthy = {r.label: health_problem(r.summary) for r in results}
    for label, problem in unhealthy.items():
        if problem:
            print(f"[compare] WARNING {label} did not learn: {problem}", file=sys.stderr)
    if any(unhealthy.values()) and not args.allow_divergence:
        return DIVERGED_EXIT
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    print(f"[compare] signal {signum}: stopping the SuperLink", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fedsync.simulations.compare",
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
    parser.add_argument(
        "--seed",
        type=int,
        help="run-config seed of every strategy (default: the scenario's own)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream every run's log")
    parser.add_argument(
        "--allow-divergence",
        action="store_true",
        help=f"exit 0, not {DIVERGED_EXIT}, when a run diverged or stayed at chance",
    )
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


if __name__ == "__main__":
    sys.exit(main())
