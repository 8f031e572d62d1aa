"""The base of fedsync's asynchronous strategies as objects for your own ServerApp.

Shaped like Flower's strategies (``flwr.serverapp.strategy.FedAvg``): keyword arguments
in the constructor, ``start(grid=..., initial_arrays=..., evaluate_fn=...)`` in your
``@app.main()``, a :class:`Result` back::

    from fedsync.serverapp import TEASQ

    strategy = TEASQ(concurrency=5, buffer_size=3, uplink_codec="topk:{density}+uniform:{bits}+ef")
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        evaluate_fn=global_evaluate,           # Flower's: (server_round, arrays) -> MetricRecord
        max_aggregations=50,
    )
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")

Every setting is a fedsync run-config key in snake_case (``buffer_size`` is
``buffer-size``; docs/configuration.md lists them); the common ones are named
parameters, the rest go through ``**settings`` and are checked (a misspelled name is
refused with the closest valid one). Objects stand in for strings where a user would
bring their own: a staleness function, a server optimizer, compression schedules.
fedsync's own ServerApp builds its strategy with :meth:`AsyncStrategy.from_run_config`
and runs it with :meth:`AsyncStrategy.start`, as any application does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result as FlowerResult

from fedsync.aggregation.schedule import CompressionSchedule
from fedsync.aggregation.server_optimizer import ServerOptimizer
from fedsync.aggregation.staleness import StalenessFunction
from fedsync.config import ConfigValue, RunConfig, SettingsError, check_keys
from fedsync.reports import RunFailedError, RunRecorder, RunSummary
from fedsync.strategies import STRATEGIES, Strategy

__all__ = ["AsyncStrategy", "FlowerEvaluateFn", "Result"]

FlowerEvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's central evaluation: ``(server_round, arrays) -> MetricRecord | None``; here
``server_round`` is the model version (aggregations so far)."""

LIBRARY_DEFAULTS: Mapping[str, ConfigValue] = {
    "clock": "wall",
    "fleet": "",
    "plots": False,
    "checkpoint-every": 0,
}
"""Where a strategy object differs from the ``pyproject.toml`` defaults of fedsync's own
app: real time (no simulated fleet), no PNG plots and no server checkpoints unless asked
for (``plots=True``, ``checkpoint_every=10``)."""


@dataclass
class Result(FlowerResult):
    """What :meth:`AsyncStrategy.start` returns: Flower's ``Result`` and fedsync's summary.

    Attributes
    ----------
    arrays : ArrayRecord
        The final global model.
    evaluate_metrics_serverapp : dict of int to MetricRecord
        Your ``evaluate_fn``'s metrics by model version.
    summary : dict
        The run's ``summary.json`` document (bytes each way, staleness, rejections,
        health, target, per-device times).
    folder : pathlib.Path or None
        The results folder (events, summary, plots); ``None`` when none was asked for.
    run_summary : RunSummary or None
        The summary as an object (fedsync's ServerApp writes it).
    """

    summary: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    run_summary: RunSummary | None = None


class AsyncStrategy:
    """An asynchronous strategy of fedsync's engine, configured by keyword arguments.

    Parameters
    ----------
    concurrency : int
        ``C``: most tasks in flight at once.
    buffer_size : int
        ``K``: updates cached per aggregation.
    staleness : str, StalenessFunction or callable
        Weight of an update by its staleness: a spec (``"polynomial:0.5"``), a
        :class:`~fedsync.aggregation.staleness.StalenessFunction`, or any
        ``staleness -> weight`` callable.
    max_staleness : int or None
        Drop updates staler than this (``None``: no limit).
    server_optimizer : str or ServerOptimizer
        ``"sgd"``, ``"momentum"``, ``"nesterov"``, ``"adam"``, or an optimizer object
        (:mod:`fedsync.aggregation.server_optimizer`).
    server_learning_rate, server_momentum : float
        For a named server optimizer.
    uplink_codec : str or CompressionSchedule
        The devices' update codec: a spec (``{density}`` and ``{bits}`` filled by the
        schedule keys ``density_start``, ...), or a
        :class:`~fedsync.aggregation.schedule.CompressionSchedule`.
    downlink_codec : str
        Codec of whole-model downlinks.
    downlink_kind : {"delta", "full", "shared"}
        Deltas against the model each device holds, the whole model every task, or one
        change per model version shared by every device
        (:mod:`fedsync.aggregation.shared_downlink`; ``downlink_max_versions=``);
        ``downlink_seeded_start=True`` when every device builds ``initial_arrays`` itself
        (:func:`fedsync.models.initial.seeded_model` on both sides): first tasks then
        start from it instead of carrying the whole model.
    downlink_delta_codec : str or CompressionSchedule
        Codec of delta downlinks.
    **settings
        Any other fedsync run-config key in snake_case (``server_device="cuda"``,
        ``prune_at_version=20``, ``ab_rank=8``, ``max_update_norm=100.0``, ...).

    Raises
    ------
    fedsync.config.SettingsError
        An unknown setting (named with the closest valid one) or an invalid value.
    """

    name: ClassVar[str] = "teasq"
    """The engine strategy (``fedsync.strategies``) this class runs."""

    def __init__(
        self,
        *,
        concurrency: int = 5,
        buffer_size: int = 3,
        staleness: str | StalenessFunction | Callable[[int], float] = "polynomial:0.5",
        max_staleness: int | None = None,
        server_optimizer: str | ServerOptimizer = "sgd",
        server_learning_rate: float = 1.0,
        server_momentum: float = 0.9,
        uplink_codec: str | CompressionSchedule = "topk:{density}+uniform:{bits}+ef",
        downlink_codec: str = "none+fp16",
        downlink_kind: str = "delta",
        downlink_delta_codec: str | CompressionSchedule = "none+uniform:{bits}",
        **settings: ConfigValue,
    ) -> None:
        values: dict[str, Any] = {
            **LIBRARY_DEFAULTS,
            "concurrency": concurrency,
            "buffer-size": buffer_size,
            "max-staleness": -1 if max_staleness is None else max_staleness,
            "server-learning-rate": server_learning_rate,
            "server-momentum": server_momentum,
            "downlink-codec": downlink_codec,
            "downlink-kind": downlink_kind,
        }
        staleness_function = None
        if isinstance(staleness, str):
            values["staleness"] = staleness
        else:
            staleness_function = _as_staleness(staleness)
        optimizer = None
        if isinstance(server_optimizer, str):
            values["server-optimizer"] = server_optimizer
        else:
            optimizer = server_optimizer
        values.update(_schedule_keys(uplink_codec, ""))
        values.update(_schedule_keys(downlink_delta_codec, "downlink-"))
        extra = {name.replace("_", "-"): value for name, value in settings.items()}
        check_keys(extra)
        if "strategy" in extra:
            raise SettingsError(
                f"{type(self).__name__} runs strategy {self.name!r}; pick another class "
                "instead of passing strategy="
            )
        values.update(extra)
        config = RunConfig.from_run_config({**values, "strategy": self.name})
        self._bind(config, staleness_function, optimizer)

    def _bind(
        self,
        config: RunConfig,
        staleness_function: StalenessFunction | None = None,
        optimizer: ServerOptimizer | None = None,
    ) -> None:
        self.config = config
        """Every setting, typed and checked (what checkpoints and summaries record)."""
        self.staleness_function = staleness_function
        """A staleness function object given in place of the ``staleness`` spec."""
        self.optimizer = optimizer
        """A server optimizer object given in place of the ``server-optimizer`` name."""

    @classmethod
    def from_run_config(cls, config: RunConfig) -> AsyncStrategy:
        """The strategy a run config describes (fedsync's own ServerApp reads its run
        config into it; ``RunConfig.from_run_config(context.run_config, prefix=...)``
        reads yours)."""
        strategy = _CLASSES.get(config.strategy, cls)
        built = strategy.__new__(strategy)  # the config is made: __init__'s work is done
        built._bind(config)
        return built

    # --- running ------------------------------------------------------------------------------
    def start(
        self,
        *,
        grid: Grid,
        initial_arrays: ArrayRecord,
        evaluate_fn: FlowerEvaluateFn | None = None,
        train_config: ConfigRecord | Mapping[str, ConfigValue] | None = None,
        max_aggregations: int | None = None,
        max_wall_time: float | None = None,
        eval_every: int | None = None,
        target_accuracy: float | None = None,
        results_dir: str | Path | None = None,
        run_name: str = "",
        recorder: RunRecorder | None = None,
    ) -> Result:
        """Run the strategy over the Grid until a stop condition; return the result.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            Your ServerApp's Grid (simulation or deployment alike).
        initial_arrays : ArrayRecord
            The initial global model (``ArrayRecord(net.state_dict())``).
        evaluate_fn : callable, optional
            Flower's ``(server_round, arrays) -> MetricRecord | None``, called every
            ``eval_every`` aggregations and at the end; ``server_round`` is the model
            version. Report ``accuracy`` and ``loss`` to get the target and the
            divergence check.
        train_config : ConfigRecord or mapping, optional
            Your keys for every task's ``msg.content["config"]`` (``{"lr": 0.01}``).
        max_aggregations, max_wall_time, eval_every, target_accuracy : optional
            Stop after this many aggregations / real seconds; evaluate every N
            aggregations; report when this accuracy is reached (default: the
            strategy's settings).
        results_dir : str or path, optional
            Write ``events.jsonl``, ``summary.json`` (and plots with ``plots=True``)
            to ``<results_dir>/<run_name or a timestamp>``; default: nothing is kept.
        run_name : str
            The results folder's name.
        recorder : RunRecorder, optional
            Write into this recorder instead (fedsync's ServerApp passes its own).

        Returns
        -------
        Result
            ``arrays`` (the final model), ``evaluate_metrics_serverapp``, ``summary``.

        Raises
        ------
        fedsync.reports.RunFailedError
            When the run could not go on (every device was given up), naming the
            error the devices failed with; the reports are written first.
        """
        config = self._with_stop(max_aggregations, max_wall_time, eval_every, target_accuracy)
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
            try:
                result = self._run(grid, config, initial, evaluate_fn, user_config, recorder)
                if owned:
                    recorder.write_summary(result.summary)
            finally:
                if owned:
                    recorder.close()
            result.folder = recorder.folder if (results_dir or not owned) else None
        failure = result.summary.get("failure")
        if owned and failure:
            # As fedsync's ServerApp does: Flower then marks the run failed (`flwr ls`).
            raise RunFailedError(str(failure))
        return result

    def _with_stop(
        self,
        max_aggregations: int | None,
        max_wall_time: float | None,
        eval_every: int | None,
        target_accuracy: float | None,
    ) -> RunConfig:
        config = self.config
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
        self,
        grid: Grid,
        config: RunConfig,
        initial: Mapping[str, torch.Tensor],
        evaluate_fn: FlowerEvaluateFn | None,
        train_config: Mapping[str, ConfigValue],
        recorder: RunRecorder,
    ) -> Result:
        # Loaded here: the run's machinery (engine, codecs, checkpoints) is heavy.
        from fedsync.serverapp.checkpoint import check_fits, find_resume, store_for
        from fedsync.serverapp.run import run_async

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
            strategy=self._policy(config),
            optimizer=self.optimizer,
            train_config=train_config,
        )
        outcome.result.details["checkpoints"] = {
            "every": section.checkpoint_every,
            "folder": str(store.folder) if section.checkpoint_every > 0 else None,
            "resumed_from": str(found[0]) if found is not None else None,
        }
        summary = outcome.summary
        summary["wall_seconds"] = round(time.monotonic() - started, 3)
        return Result(
            arrays=ArrayRecord({k: v.detach().to("cpu") for k, v in outcome.global_state.items()}),
            evaluate_metrics_serverapp=metrics,
            summary=summary,
            run_summary=outcome.result,
        )

    def _policy(self, config: RunConfig) -> Strategy:
        policy = STRATEGIES[config.strategy](config.asynchronous)
        if self.staleness_function is not None:
            policy.staleness = self.staleness_function
        return policy

    def __repr__(self) -> str:
        settings = self.config.asynchronous
        return (
            f"{type(self).__name__}(concurrency={settings.concurrency}, "
            f"buffer_size={settings.buffer_size}, staleness={settings.staleness!r}, "
            f"uplink_codec={self.config.compression.uplink_codec!r})"
        )


@dataclass(frozen=True)
class _CallableStaleness(StalenessFunction):
    """Any ``staleness -> weight`` callable as a staleness function."""

    function: Callable[[int], float]

    def weight(self, staleness: int) -> float:
        return float(self.function(staleness))

    def spec(self) -> str:
        return f"custom:{getattr(self.function, '__name__', type(self.function).__name__)}"


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


def _as_staleness(value: StalenessFunction | Callable[[int], float]) -> StalenessFunction:
    if isinstance(value, StalenessFunction):
        return value
    if not callable(value):
        raise SettingsError(
            f"staleness must be a spec, a StalenessFunction or a callable: {value!r}"
        )
    return _CallableStaleness(value)


def _schedule_keys(value: str | CompressionSchedule, prefix: str) -> dict[str, ConfigValue]:
    """A codec argument as run-config keys (``prefix``: ``""`` uplink, ``"downlink-"``)."""
    codec_key = "uplink-codec" if not prefix else "downlink-delta-codec"
    if isinstance(value, str):
        return {codec_key: value}
    if not isinstance(value, CompressionSchedule):
        raise SettingsError(f"{codec_key} must be a spec or a CompressionSchedule: {value!r}")
    return {
        codec_key: value.template,
        f"{prefix}density-start": value.density_start,
        f"{prefix}density-floor": value.density_floor,
        f"{prefix}density-decay": value.density_decay,
        f"{prefix}bits-start": value.bits_start,
        f"{prefix}bits-floor": value.bits_floor,
        f"{prefix}bits-decay": value.bits_decay,
        "decay-kind": value.kind,
    }


_CLASSES: dict[str, type[AsyncStrategy]] = {}
"""Public strategy classes by engine name (filled by :mod:`fedsync.serverapp`)."""
