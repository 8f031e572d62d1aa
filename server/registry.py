"""Strategies by run-config name: Flower's FedAvg, and every engine strategy."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context
from flwr.serverapp import Grid

from fedsync.config import RunConfig
from fedsync.reports import RunRecorder, RunSummary
from fedsync.serverapp.evaluation import CentralEvaluator
from fedsync.serverapp.run import run_async_strategy
from fedsync.serverapp.run_fedavg import run_fedavg
from fedsync.strategies import STRATEGIES as ENGINE_STRATEGIES

StrategyRunner = Callable[[Grid, Context, RunConfig, RunRecorder, CentralEvaluator], RunSummary]
"""Runs one strategy to the end and returns its summary (written to summary.json)."""

STRATEGIES: dict[str, StrategyRunner] = {
    RunConfig.BASELINE: run_fedavg,
    **dict.fromkeys(ENGINE_STRATEGIES, run_async_strategy),
}
"""``fedavg`` runs Flower's own strategy; every other name runs on fedsync's engine."""
