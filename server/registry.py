"""Strategies by run-config name: one function each, no if/elif chain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid

from fedsync.reports import RunRecorder
from fedsync.settings import TrainingSettings
from server.async_loop import run_async_strategy
from server.evaluation import CentralEvaluator
from server.run_fedavg import run_fedavg

StrategyRunner = Callable[
    [Grid, Context, TrainingSettings, RunRecorder, CentralEvaluator], dict[str, Any]
]
"""Runs one strategy to the end and returns its summary (written to summary.json)."""

STRATEGIES: dict[str, StrategyRunner] = {
    "fedavg": run_fedavg,
    # The asynchronous policies share one loop; the run config's strategy picks K, C,
    # staleness weighting and mixing (fedsync.aggregation.policies).
    "teasq": run_async_strategy,
    "fedbuff": run_async_strategy,
    "fedasync": run_async_strategy,
}
