"""Run an asynchronous strategy over the Grid: engine, channel, checkpoints, reports.

:meth:`fedsync.strategies.Strategy.start` runs here (:func:`start_strategy`), fedsync's
own ServerApp through it (:func:`run_async_strategy`); :func:`run_async` is the same
with the pieces given, for tests and programmatic runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result as FlowerResult

from fedsync.aggregation.downlink import CodecFactory
from fedsync.aggregation.guard import UpdateNormGuard
from fedsync.aggregation.server_optimizer import ServerOptimizer
from fedsync.clock import Clock
from fedsync.config import APP_ONLY_KEYS, ConfigValue, RunConfig, SettingsError
from fedsync.engine import AggregationEngine
from fedsync.reports import RunFailedError, RunRecorder, RunSummary
from fedsync.serverapp.channel import GridChannel
from fedsync.serverapp.checkpoint import AsyncCheckpoint
from fedsync.serverapp.evaluation import CentralEvaluator
from fedsync.serverapp.loop import AsyncRun, EvaluateFn
from fedsync.strategies import Strategy

FlowerEvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's central evaluation: ``(server_round, arrays) -> MetricRecord | None``; here
``server_round`` is the model version (aggregations so far)."""

__all__ = [
    "AsyncResult",
    "FlowerEvaluateFn",
    "Result",
    "run_async",
    "run_async_strategy",
    "start_strategy",
]


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
        (:meth:`fedsync.strategies.Strategy.start` passes them).
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


@dataclass
class Result(FlowerResult):
    """What :meth:`~fedsync.strategies.Strategy.start` returns: Flower's ``Result`` and
    fedsync's summary.

    Attributes
    ----------
    arrays : ArrayRecord
        The final global model.
    evaluate_metrics_serverapp : dict of int to MetricRecord
        Your ``evaluate_fn``'s metrics by model version.
    summary : dict
        The run's ``summary.json`` document (bytes each way, staleness, rejections,
        health, target, per-device times, the clock).
    folder : pathlib.Path or None
        The results folder (events, summary, plots); ``None`` when none was asked for.
    run_summary : RunSummary or None
        The summary as an object (fedsync's ServerApp writes it).
    """

    summary: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    run_summary: RunSummary | None = None


def start_strategy(
    strategy: Strategy,
    *,
    grid: Grid,
    initial_arrays: ArrayRecord,
    evaluate_fn: FlowerEvaluateFn | None,
    train_config: ConfigRecord | Mapping[str, ConfigValue] | None,
    max_aggregations: int | None,
    max_wall_time: float | None,
    eval_every: int | None,
    target_accuracy: float | None,
    results_dir: str | Path | None,
    run_name: str,
    recorder: RunRecorder | None,
) -> Result:
    """:meth:`fedsync.strategies.Strategy.start`'s work (its docstring says what each
    argument does)."""
    config = _with_stop(
        strategy.config, max_aggregations, max_wall_time, eval_every, target_accuracy
    )
    user_config = _task_config(train_config)
    initial = initial_arrays.to_torch_state_dict()
    owned = recorder is None
    with contextlib.ExitStack() as scratch:
        if recorder is None:
            folder = (
                Path(results_dir).expanduser().resolve()
                if results_dir
                else Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="fedsync-")))
            )
            recorder = RunRecorder(folder, run_name)
        kept = recorder.folder if (results_dir or not owned) else None
        _announce(strategy, config, kept)
        try:
            # Your own app's run: its summary lists what the run used, not the keys
            # only fedsync's own app reads.
            result = _run(
                strategy, grid, config, initial, evaluate_fn, user_config, recorder, owned
            )
            if owned:
                recorder.write_summary(result.summary)
        finally:
            if owned:
                recorder.close()
        result.folder = kept
    failure = result.summary.get("failure")
    if owned and failure:
        # As fedsync's ServerApp does: Flower then marks the run failed (`flwr ls`).
        raise RunFailedError(str(failure))
    return result


def _announce(strategy: Strategy, config: RunConfig, folder: Path | None) -> None:
    """Say once which clock times the run (the virtual clock's times are simulated) and
    where its reports go."""
    clock = config.clock
    if clock.clock == "virtual":
        timing = f"the virtual clock (simulated seconds, fleet {clock.fleet or 'uniform'!r})"
    else:
        timing = "the wall clock (real seconds; clock='virtual' and a fleet simulate one)"
    where = f"results in {folder}" if folder is not None else "no results folder kept"
    log(INFO, "[fedsync] %s on %s; %s", type(strategy).__name__, timing, where)


def _with_stop(
    config: RunConfig,
    max_aggregations: int | None,
    max_wall_time: float | None,
    eval_every: int | None,
    target_accuracy: float | None,
) -> RunConfig:
    stop: dict[str, Any] = {}
    if max_aggregations is not None:
        stop["max_aggregations"] = max_aggregations
    if max_wall_time is not None:
        stop["max_wall_time"] = float(max_wall_time)
    if target_accuracy is not None:
        stop["target_accuracy"] = float(target_accuracy)
    if stop:
        config = dataclasses.replace(config, stop=dataclasses.replace(config.stop, **stop))
    if eval_every is not None:
        runtime = dataclasses.replace(config.runtime, eval_every=eval_every)
        config = dataclasses.replace(config, runtime=runtime)
    return config


def _run(
    strategy: Strategy,
    grid: Grid,
    config: RunConfig,
    initial: Mapping[str, torch.Tensor],
    evaluate_fn: FlowerEvaluateFn | None,
    train_config: Mapping[str, ConfigValue],
    recorder: RunRecorder,
    library: bool,
) -> Result:
    from fedsync.serverapp.checkpoint import check_fits, find_resume, store_for

    section = config.checkpoints
    store = store_for(section, recorder.folder)
    found = find_resume(section, store, run_name=config.output.run_name)
    resume = None
    if found is not None:
        path, resume = found
        check_fits(resume, initial)
        recorder.events.write("resume", checkpoint=str(path), version=resume.version)
    metrics: dict[int, MetricRecord] = {}

    def evaluate(version: int, state: Mapping[str, torch.Tensor]) -> dict[str, float] | None:
        if evaluate_fn is None:
            return None
        arrays = ArrayRecord({k: v.detach().to("cpu") for k, v in state.items()})
        record = evaluate_fn(version, arrays)
        if record is None:
            return None
        metrics[version] = record
        return {k: float(v) for k, v in record.items() if isinstance(v, int | float)}

    started = time.monotonic()
    outcome = run_async(
        grid,
        config,
        recorder=recorder,
        global_state=initial,
        evaluate_fn=evaluate,
        resume=resume,
        checkpoint_fn=store.save if section.checkpoint_every > 0 else None,
        strategy=strategy,
        optimizer=strategy.optimizer,
        train_config=train_config,
    )
    outcome.result.details["checkpoints"] = {
        "every": section.checkpoint_every,
        "folder": str(store.folder) if section.checkpoint_every > 0 else None,
        "resumed_from": str(found[0]) if found is not None else None,
    }
    if library:
        used = outcome.result.config
        outcome.result.config = {k: v for k, v in used.items() if k not in APP_ONLY_KEYS}
    summary = outcome.summary
    summary["wall_seconds"] = round(time.monotonic() - started, 3)
    return Result(
        arrays=ArrayRecord({k: v.detach().to("cpu") for k, v in outcome.global_state.items()}),
        evaluate_metrics_serverapp=metrics,
        summary=summary,
        run_summary=outcome.result,
    )


def _task_config(
    train_config: ConfigRecord | Mapping[str, ConfigValue] | None,
) -> dict[str, ConfigValue]:
    """The application's task keys, checked: scalars only (what fedsync's task record
    carries), none of fedsync's own."""
    from fedsync import protocol

    values: dict[str, ConfigValue] = {}
    for key, value in (train_config or {}).items():
        if not isinstance(value, bool | int | float | str):
            raise SettingsError(f"train_config[{key!r}] must be a bool, int, float or str")
        if key in protocol.TASK_KEYS:
            raise SettingsError(f"train_config key {key!r} is fedsync's own; rename it")
        values[key] = value
    return values


def run_async_strategy(
    grid: Grid,
    context: Context,
    config: RunConfig,
    recorder: RunRecorder,
    evaluator: CentralEvaluator,
) -> RunSummary:
    """fedsync's own ServerApp's runner for every engine strategy, a user of the public
    API (:meth:`fedsync.strategies.Strategy.from_run_config` and ``start``).

    Checkpoints and resuming follow the run config (:mod:`fedsync.serverapp.checkpoint`),
    the norm check too; ``server-device`` says where the engine keeps the model, the
    buffer and the optimizer state (a checkpoint written on one device resumes on any
    other), ``device`` where the central evaluation runs.
    """

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord(dict(evaluator(arrays.to_torch_state_dict())))

    result = Strategy.from_run_config(config).start(
        grid=grid,
        initial_arrays=ArrayRecord(evaluator.initial_state()),
        evaluate_fn=evaluate,
        recorder=recorder,
    )
    assert result.run_summary is not None
    return result.run_summary
