"""The base of fedsync's asynchronous strategies: keyword arguments, ``start``, a few hooks.

Shaped like Flower's strategies (``flwr.serverapp.strategy.FedAvg``): keyword arguments
in the constructor, ``start(grid=..., initial_arrays=..., evaluate_fn=...)`` in your
``@app.main()``, a :class:`~fedsync.serverapp.Result` back::

    from fedsync.serverapp import TEASQ

    strategy = TEASQ(concurrency=5, buffer_size=3, uplink_codec="topk:{density}+uniform:{bits}+ef")
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        evaluate_fn=global_evaluate,           # Flower's: (server_round, arrays) -> MetricRecord
        max_aggregations=50,
    )

The engine (:mod:`fedsync.engine`) runs every strategy the same way::

    reply -> check() -> accepts() (staleness gate) -> weight() -> contribution()
          -> buffer (K cached) -> optimizer step -> version + 1

A strategy says *what* happens at each arrow; the engine says *when*. A new strategy is
one file in this folder: subclass :class:`Strategy`, set :attr:`Strategy.name` (which
registers it in :data:`STRATEGIES`), override the hooks that differ, import it in
``fedsync/strategies/__init__.py`` (docs/architecture.md, "Adding a strategy").

This module imports no Flower: :meth:`Strategy.start` loads the server loop
(:mod:`fedsync.serverapp.run`) when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from fedsync.aggregation.buffer import Normalization
from fedsync.aggregation.schedule import CompressionSchedule
from fedsync.aggregation.server_optimizer import ServerOptimizer
from fedsync.aggregation.staleness import StalenessFunction, parse_staleness
from fedsync.config import AsyncSection, ConfigValue, RunConfig
from fedsync.strategies.arguments import as_staleness, run_config_of
from fedsync.updates import SparseTensor

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp import Grid

    from fedsync.reports import RunRecorder
    from fedsync.serverapp.run import FlowerEvaluateFn, Result

__all__ = ["STRATEGIES", "Arrival", "Contribution", "Strategy"]

Contribution = Mapping[str, Any]
"""What goes into the buffer per tensor: a :class:`~fedsync.updates.SparseTensor`, or a
dense ``torch.Tensor`` of the tensor's shape."""

STRATEGIES: dict[str, type[Strategy]] = {}
"""Strategy classes by their ``strategy`` run-config name, filled by subclassing."""


@dataclass(frozen=True)
class Arrival:
    """A decoded, valid update as a strategy judges it.

    Attributes
    ----------
    staleness : int
        Aggregations since the model version the task started from.
    num_examples : int
        The device's training examples, as its reply says.
    version : int
        The model version the task started from.
    """

    staleness: int
    num_examples: int
    version: int


class Strategy:
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
        ``"sgd"``, ``"momentum"``, ``"nesterov"``, ``"delayed-nesterov"``, ``"adam"``, or
        an optimizer object (:mod:`fedsync.aggregation.server_optimizer`).
    server_learning_rate, server_momentum : float
        For a named server optimizer.
    uplink_codec : str or CompressionSchedule
        The devices' update codec: a spec (``{density}`` and ``{bits}`` filled by the
        schedule keys ``density_start``, ...), or a
        :class:`~fedsync.aggregation.schedule.CompressionSchedule`. Checked here: a
        misspelled stage is refused with the closest valid name.
    downlink_codec : str
        Codec of whole-model downlinks.
    downlink_kind : {"delta", "full", "shared", "relay"}
        Deltas against the model each device holds, the whole model every task, one
        change per model version shared by every device
        (:mod:`fedsync.aggregation.shared_downlink`), or the aggregated updates
        themselves (:mod:`fedsync.aggregation.relay_downlink`).
    downlink_delta_codec : str or CompressionSchedule
        Codec of delta downlinks.
    results_dir : str, path or None
        Write ``events.jsonl``, ``summary.json`` (and plots with ``plots=True``) under
        this folder, as :meth:`start`'s ``results_dir`` does (which wins when both are
        given); ``None``: nothing is kept.
    **settings
        Any other fedsync run-config key in snake_case (``server_device="cuda"``,
        ``clock="virtual"``, ``prune_at_version=20``, ``max_update_norm=100.0``, ...;
        docs/configuration.md lists them).

    Raises
    ------
    fedsync.config.SettingsError
        An unknown argument (named in snake_case with the closest valid one) or an
        invalid value.

    Class attributes
    ----------------
    name : str
        The ``strategy`` run-config value; setting it registers the class.
    normalization : {"count", "weight", "selected"}
        How the buffer turns its weighted sum into a mean (see
        :class:`~fedsync.aggregation.buffer.UpdateBuffer`), unless ``buffer_mean``
        names another (:attr:`mean` is the one in use).
    decaying_compression : bool
        Follow the compression schedule's decay (TEASQ-Fed); otherwise its start values.
    needs_start_model : bool
        :meth:`contribution` needs the model each update started from (the engine then
        keeps the decoded downlink of every task in flight).
    synchronous : bool
        Rounds: the server's loop plans no task from a model version once ``K`` tasks of
        it are buffered or in flight, so the next tasks start from the stepped model and
        every update has staleness 0.
    """

    name: ClassVar[str] = ""
    normalization: ClassVar[Normalization] = "count"
    decaying_compression: ClassVar[bool] = False
    needs_start_model: ClassVar[bool] = False
    synchronous: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name", "")
        if name:
            if name in STRATEGIES:
                raise TypeError(f"strategy {name!r} is already {STRATEGIES[name].__name__}")
            STRATEGIES[name] = cls

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
        results_dir: str | Path | None = None,
        **settings: ConfigValue,
    ) -> None:
        if not self.name:
            raise TypeError(
                "Strategy is the base of fedsync's strategies: use TEASQ, FedBuff, "
                "FedAsync, FedAsyncMix or DiLoCo (or a subclass with its own name)"
            )
        arguments: dict[str, Any] = {
            "concurrency": concurrency,
            "buffer_size": buffer_size,
            "staleness": staleness,
            "max_staleness": max_staleness,
            "server_optimizer": server_optimizer,
            "server_learning_rate": server_learning_rate,
            "server_momentum": server_momentum,
            "uplink_codec": uplink_codec,
            "downlink_codec": downlink_codec,
            "downlink_kind": downlink_kind,
            "downlink_delta_codec": downlink_delta_codec,
            **settings,
        }
        config = run_config_of(type(self).__name__, self.name, arguments)
        staleness_function = None if isinstance(staleness, str) else as_staleness(staleness)
        optimizer = None if isinstance(server_optimizer, str) else server_optimizer
        self._bind(config, staleness_function, optimizer, results_dir)

    def _bind(
        self,
        config: RunConfig,
        staleness_function: StalenessFunction | None = None,
        optimizer: ServerOptimizer | None = None,
        results_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        """Every setting, typed and checked (what checkpoints and summaries record)."""
        self.optimizer = optimizer
        """A server optimizer object given in place of the ``server-optimizer`` name."""
        self.results_dir = None if results_dir is None else Path(results_dir)
        """Where :meth:`start` writes its reports unless told another folder."""
        settings = config.asynchronous
        self.staleness: StalenessFunction = staleness_function or parse_staleness(
            settings.staleness
        )
        """Weight of an update by its staleness."""
        self.configure(settings)

    @classmethod
    def from_run_config(cls, config: RunConfig) -> Strategy:
        """The strategy a run config describes: the class its ``strategy`` names, with
        every setting as the config has it (fedsync's own ServerApp reads its run config
        into one; ``RunConfig.from_run_config(context.run_config, prefix=...)`` reads
        yours). Called on a subclass, the config must name that subclass's strategy."""
        if config.strategy not in STRATEGIES:
            raise ValueError(f"{config.strategy!r} is not a strategy of fedsync's engine")
        strategy = STRATEGIES[config.strategy]
        if not issubclass(strategy, cls):
            raise ValueError(f"the run config names {config.strategy!r}, not {cls.name!r}")
        built = object.__new__(strategy)
        built._bind(config)
        return built

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Refuse a run config this strategy cannot run as asked, naming the key
        (:class:`~fedsync.config.SettingsError`); the reader calls it for the strategy
        the config names. The base accepts every config its sections accepted."""

    # --- the numbers the engine reads --------------------------------------------------------
    def configure(self, settings: AsyncSection) -> None:
        """Read this strategy's numbers from its settings (subclasses add their own)."""
        self.concurrency = settings.concurrency
        """``C``: most tasks in flight."""
        self.buffer_size = self.cached_updates(settings)
        """``K``: updates per aggregation."""
        self.mean: Normalization = (
            self.normalization
            if settings.buffer_mean == "auto"
            else cast(Normalization, settings.buffer_mean)
        )
        """How this run's buffer turns its weighted sum into a mean."""
        self.max_staleness: int | None = (
            None if settings.max_staleness < 0 else settings.max_staleness
        )
        """Updates staler than this are dropped (``None``: no limit)."""

    # --- hooks ------------------------------------------------------------------------------
    def cached_updates(self, settings: AsyncSection) -> int:
        """``K``: updates per aggregation (default: ``buffer-size``)."""
        return settings.buffer_size

    def check(self, arrival: Arrival) -> str:
        """``""`` if the reply's metadata can be used, else why not (it is rejected)."""
        return ""

    def accepts(self, arrival: Arrival) -> bool:
        """Whether an update this stale may be aggregated at all (else it is dropped)."""
        return self.max_staleness is None or arrival.staleness <= self.max_staleness

    def weight(self, arrival: Arrival) -> float:
        """The aggregation weight of an accepted update (default: ``s(staleness)``)."""
        return self.staleness(arrival.staleness)

    def contribution(
        self,
        update: Mapping[str, SparseTensor],
        arrival: Arrival,
        model: Mapping[str, torch.Tensor],
        start: Mapping[str, torch.Tensor] | None,
    ) -> Contribution:
        """What the buffer adds (times :meth:`weight`); default: the update itself.

        Parameters
        ----------
        update : mapping of str to SparseTensor
            The decoded, validated update (local model minus start model), read-only:
            returned as it is, it goes into the buffer without another check; anything
            else returned is checked once before it does.
        arrival : Arrival
            Its staleness and size.
        model : mapping of str to torch.Tensor
            The global model's trained tensors now.
        start : mapping of str to torch.Tensor or None
            The model the device started from (only with :attr:`needs_start_model`).
        """
        return update

    def describe(self) -> dict[str, Any]:
        """The strategy's numbers, for ``summary.json``."""
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "buffer_size": self.buffer_size,
            "staleness": self.staleness.spec(),
            "max_staleness": self.max_staleness,
            "normalization": self.mean,
            "decaying_compression": self.decaying_compression,
            "synchronous": self.synchronous,
        }

    # --- running ----------------------------------------------------------------------------
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
            Write ``events.jsonl`` (docs/events.md), ``summary.json`` (and plots with
            ``plots=True``) to ``<results_dir>/<run_name or a timestamp>``; default:
            the constructor's ``results_dir``, else nothing is kept. A relative folder
            is taken from this process's working directory; the log names the folder.
        run_name : str
            The results folder's name.
        recorder : RunRecorder, optional
            Write into this recorder instead (fedsync's ServerApp passes its own).

        Returns
        -------
        fedsync.serverapp.Result
            ``arrays`` (the final model), ``evaluate_metrics_serverapp``, ``summary``.

        Raises
        ------
        fedsync.reports.RunFailedError
            When the run could not go on (every device was given up), naming the
            error the devices failed with; the reports are written first.
        """
        from fedsync.serverapp.run import start_strategy

        return start_strategy(
            self,
            grid=grid,
            initial_arrays=initial_arrays,
            evaluate_fn=evaluate_fn,
            train_config=train_config,
            max_aggregations=max_aggregations,
            max_wall_time=max_wall_time,
            eval_every=eval_every,
            target_accuracy=target_accuracy,
            results_dir=results_dir if results_dir is not None else self.results_dir,
            run_name=run_name,
            recorder=recorder,
        )

    def __repr__(self) -> str:
        settings = self.config.asynchronous
        return (
            f"{type(self).__name__}(concurrency={settings.concurrency}, "
            f"buffer_size={settings.buffer_size}, staleness={settings.staleness!r}, "
            f"uplink_codec={self.config.compression.uplink_codec!r})"
        )
