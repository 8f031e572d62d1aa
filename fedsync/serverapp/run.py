"""Run an asynchronous strategy as the ServerApp does: engine, channel, checkpoints.

:func:`run_async_strategy` is what the strategy registry calls (the run config decides
everything); :func:`run_async` is the same with the pieces given, for tests and
programmatic runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid

from fedsync.aggregation.downlink import CodecFactory
from fedsync.aggregation.guard import UpdateNormGuard
from fedsync.aggregation.server_optimizer import ServerOptimizer
from fedsync.clock import Clock
from fedsync.config import ConfigValue, RunConfig
from fedsync.engine import AggregationEngine
from fedsync.reports import RunRecorder, RunSummary
from fedsync.serverapp.channel import GridChannel
from fedsync.serverapp.checkpoint import AsyncCheckpoint
from fedsync.serverapp.evaluation import CentralEvaluator
from fedsync.serverapp.loop import AsyncRun, EvaluateFn
from fedsync.strategies import Strategy

__all__ = ["AsyncResult", "run_async", "run_async_strategy"]


@dataclass
class AsyncResult:
    """What :func:`run_async` returns: the summary, the engine and a checkpoint."""

    result: RunSummary
    engine: AggregationEngine
    checkpoint: AsyncCheckpoint

    @property
    def global_state(self) -> dict[str, torch.Tensor]:
        """The final global model (every tensor of the state dict)."""
        return self.engine.state

    @property
    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        return self.result.to_dict()

    @property
    def version(self) -> int:
        """Aggregations done (including those before a resume)."""
        return self.result.aggregations

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """Every central evaluation of this run."""
        return self.result.tally.evaluations


def run_async(
    grid: Grid,
    config: RunConfig,
    *,
    recorder: RunRecorder,
    global_state: Mapping[str, torch.Tensor],
    evaluate_fn: EvaluateFn,
    codec_factory: CodecFactory | None = None,
    clock: Clock | None = None,
    resume: AsyncCheckpoint | None = None,
    checkpoint_fn: Callable[[AsyncCheckpoint], object] | None = None,
    norm_guard: UpdateNormGuard | None = None,
    sleep: Callable[[float], None] = time.sleep,
    device: str | torch.device | None = None,
    strategy: Strategy | None = None,
    optimizer: ServerOptimizer | None = None,
    train_config: Mapping[str, ConfigValue] | None = None,
) -> AsyncResult:
    """Run the asynchronous strategy ``config.strategy`` over the Grid to a stop condition.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Flower's Grid (``push_messages`` / ``pull_messages`` / ``get_node_ids``).
    config : RunConfig
        The run's settings.
    recorder : RunRecorder
        Where events, ``summary.json`` and plots go.
    global_state : mapping of str to torch.Tensor
        The initial global model (ignored when resuming: the checkpoint's is used).
    evaluate_fn : callable
        ``(version, state) -> {"accuracy": ..., "loss": ..., ...}`` or ``None``, the
        central evaluation of the model at that version.
    codec_factory : callable, optional
        Spec string -> codec; default :func:`fedsync.engine.default_codec_factory`.
    clock : Clock, optional
        Overrides the clock the ``clock`` setting would build (tests).
    resume : AsyncCheckpoint, optional
        Continue from a checkpoint (model, optimizer state, version, counters, job).
    checkpoint_fn : callable, optional
        Receives the checkpoints (``checkpoint-every`` says when).
    norm_guard : UpdateNormGuard, optional
        The norm check; default: the one the run config's guard keys describe.
    sleep : callable
        How to wait between empty pulls (tests pass a no-op).
    device : str or torch.device, optional
        Where the engine keeps its state; default: the run config's ``server-device``.
    strategy, optimizer : optional
        Objects that replace what the run config describes
        (:class:`fedsync.serverapp.AsyncStrategy` passes them).
    train_config : mapping, optional
        The application's own keys for every task's CONFIG record.
    """
    engine = AggregationEngine(
        config,
        resume.global_state if resume is not None else global_state,
        codec_factory=codec_factory,
        norm_guard=norm_guard or UpdateNormGuard.from_section(config.guard),
        device=device,
        version=resume.version if resume is not None else 0,
        optimizer_state=resume.optimizer_state if resume is not None else None,
        pruning_state=resume.pruning if resume is not None else None,
        strategy=strategy,
        optimizer=optimizer,
    )
    channel = GridChannel(
        grid,
        task_ttl=config.runtime.task_ttl,
        poll_interval=config.runtime.poll_interval,
        sleep=sleep,
    )
    run = AsyncRun(
        engine,
        channel,
        recorder=recorder,
        evaluate_fn=evaluate_fn,
        clock=clock,
        resume=resume,
        checkpoint_fn=checkpoint_fn,
        train_config=train_config,
    )
    try:
        result = run.run()
    finally:
        channel.close()  # no reply pull outlives the run
    return AsyncResult(result, engine, run.journal.checkpoint())


def run_async_strategy(
    grid: Grid,
    context: Context,
    config: RunConfig,
    recorder: RunRecorder,
    evaluator: CentralEvaluator,
) -> RunSummary:
    """The registry's runner for every asynchronous strategy: fedsync's ServerApp as a
    user of the public API (:class:`fedsync.serverapp.AsyncStrategy`).

    Checkpoints and resuming follow the run config (:mod:`fedsync.serverapp.checkpoint`),
    the norm check too; ``server-device`` says where the engine keeps the model, the
    buffer and the optimizer state (a checkpoint written on one device resumes on any
    other), ``device`` where the central evaluation runs.
    """
    from fedsync.serverapp import AsyncStrategy

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord(dict(evaluator(arrays.to_torch_state_dict())))

    result = AsyncStrategy.from_run_config(config).start(
        grid=grid,
        initial_arrays=ArrayRecord(evaluator.initial_state()),
        evaluate_fn=evaluate,
        recorder=recorder,
    )
    assert result.run_summary is not None
    return result.run_summary
