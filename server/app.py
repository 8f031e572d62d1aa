"""The fedsync Flower ServerApp: runs the strategy the run config names and records it.

A user of the public API like any other app: Flower's FedAvg through
:func:`fedsync.serverapp.run_fedavg.run_fedavg`, every other strategy through
:meth:`fedsync.strategies.Strategy.from_run_config` and ``start``. Every strategy writes
the same results folder (``<results-dir>/<run>/``): an event log (``events.jsonl``,
docs/events.md), a ``summary.json`` (one :class:`~fedsync.reports.RunSummary`) and PNG
plots; the central test-set evaluation is shared too, so numbers from different
strategies compare like for like.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedsync.config import RunConfig
from fedsync.reports import RunFailedError, RunRecorder
from fedsync.serverapp.evaluation import CentralEvaluator
from fedsync.serverapp.run import run_async_strategy
from fedsync.serverapp.run_fedavg import run_fedavg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy named by the ``strategy`` run config key."""
    config = RunConfig.from_run_config(context.run_config)
    runner = run_fedavg if config.strategy == RunConfig.BASELINE else run_async_strategy
    recorder = RunRecorder(config.output.results_path(), config.output.run_name)
    log(INFO, "[fedsync] strategy %s, results in %s", config.strategy, recorder.folder)
    recorder.events.write("run_start", strategy=config.strategy, run_config=config.as_run_config())
    evaluator = CentralEvaluator(config.training)
    started = time.monotonic()
    try:
        summary = runner(grid, context, config, recorder, evaluator).to_dict()
        summary["wall_seconds"] = round(time.monotonic() - started, 3)
        recorder.write_summary(summary)
        recorder.events.write("run_end", wall_seconds=summary["wall_seconds"])
        log(INFO, "[fedsync] summary: %s", _headline(summary))
        log(INFO, "[fedsync] results: %s", recorder.folder)
    finally:
        recorder.close()
    if summary.get("failure"):
        # Flower marks the run failed, with this as its status details (`flwr ls`).
        raise RunFailedError(str(summary["failure"]))


def _headline(summary: dict[str, object]) -> str:
    keys = ("strategy", "final_accuracy", "best_accuracy", "total_bytes_up", "total_bytes_down")
    return ", ".join(f"{key}={summary[key]}" for key in keys if key in summary)
