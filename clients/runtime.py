"""What one ClientApp invocation knows about its node: settings, device, data, model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Context

from fedsync import protocol
from fedsync.config import (
    CompressionSection,
    RunConfig,
    SettingsError,
    TrainingSection,
    node_partition,
    resolve_device,
)
from fedsync.data import ArrayDataset
from fedsync.models.training import InnerOptimizer, LearningRateSchedule
from fedsync.models.training import train as train_model
from fedsync.protocol import TrainTask
from fedsync.recipe import client_data, model_for
from fedsync.records import get_float, get_int


@dataclass(frozen=True)
class ClientRuntime:
    """The node's view of a run, read once per message from Flower's ``Context``.

    Parameters
    ----------
    settings : TrainingSection
        The run config's data, model and training keys, typed.
    compression : CompressionSection
        The run config's compression keys (downlink kind, AB-Training's rank).
    device : torch.device
        Node config ``device`` wins over the run config's (a GPU box says ``cuda:0``).
    partition_id, num_partitions : int
        Which share of the dataset this node holds.
    node_config : mapping
        The raw node config (state folders and other node-local settings).
    """

    settings: TrainingSection
    compression: CompressionSection
    device: torch.device
    partition_id: int
    num_partitions: int
    node_config: Mapping[str, Any]

    @classmethod
    def from_context(cls, context: Context) -> ClientRuntime:
        """Read settings, device and partition from a Flower context."""
        config = RunConfig.from_run_config(context.run_config)
        settings = config.training
        node_config = dict(context.node_config)
        device = resolve_device(str(node_config.get("device", settings.device)))
        partition_id, num_partitions = node_partition(node_config)
        _limit_threads(node_config)
        return cls(settings, config.compression, device, partition_id, num_partitions, node_config)

    def data(self) -> tuple[ArrayDataset, ArrayDataset]:
        """This node's (train, validation) data; cached per process by the loader."""
        return client_data(self.settings, self.partition_id, self.num_partitions)

    def fresh_model(self) -> torch.nn.Module:
        """A new model of the run's architecture (weights are loaded from the task)."""
        return model_for(self.settings)

    def task_seed(self, config: Mapping[str, Any]) -> int:
        """A seed for this task's shuffling (Flower's dense task's ConfigRecord)."""
        base = get_int(config, protocol.TASK_SEED, self.settings.seed)
        return self.seed_for(base, get_int(config, protocol.SERVER_ROUND, 0))

    def seed_for(self, task_seed: int, server_round: int) -> int:
        """A seed for a task's shuffling: distinct per node and per task."""
        return (task_seed * 1_000_003 + self.partition_id * 7919 + server_round) % (2**31)


@dataclass(frozen=True)
class LocalTraining:
    """One task's local training settings: the task config wins over the run config."""

    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    proximal_mu: float
    max_steps: int | None
    seed: int
    optimizer: str = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    schedule: LearningRateSchedule | None = None
    max_grad_norm: float | None = None
    schedule_step: int | None = None
    """Where the schedule starts this task: the run's position the task carries
    (``None``: the device's own step count)."""

    @classmethod
    def from_task(cls, config: Mapping[str, Any], runtime: ClientRuntime) -> LocalTraining:
        """Read the task's ConfigRecord (keys in :mod:`fedsync.protocol`)."""
        settings = runtime.settings
        local_steps = get_int(config, protocol.LOCAL_STEPS, 0)
        return cls(
            epochs=get_int(config, protocol.LOCAL_EPOCHS, settings.local_epochs),
            batch_size=get_int(config, protocol.BATCH_SIZE, settings.batch_size),
            learning_rate=get_float(config, protocol.LEARNING_RATE, settings.learning_rate),
            momentum=get_float(config, protocol.MOMENTUM, settings.momentum),
            proximal_mu=get_float(config, protocol.PROXIMAL_MU, settings.proximal_mu),
            max_steps=local_steps if local_steps > 0 else None,
            seed=runtime.task_seed(config),
            **settings.optimizer_settings,
        )

    @classmethod
    def from_train_task(cls, task: TrainTask, runtime: ClientRuntime) -> LocalTraining:
        """The settings a compressed task carries (:class:`fedsync.protocol.TrainTask`)."""
        return cls(
            epochs=task.local_epochs,
            batch_size=task.batch_size,
            learning_rate=task.learning_rate,
            momentum=task.momentum,
            proximal_mu=task.proximal_mu,
            max_steps=task.local_steps if task.local_steps > 0 else None,
            seed=runtime.seed_for(task.task_seed, task.version),
            schedule_step=task.schedule_step if task.schedule_step >= 0 else None,
            **runtime.settings.optimizer_settings,
        )

    def run(
        self,
        model: torch.nn.Module,
        dataset: ArrayDataset,
        device: torch.device,
        inner: InnerOptimizer | None = None,
    ) -> Any:
        """Train ``model`` in place on ``dataset`` (from and into ``inner``, the device's
        optimizer memory, when given); returns the trainer's result."""
        return train_model(
            model,
            dataset,
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.learning_rate,
            momentum=self.momentum,
            device=device,
            proximal_mu=self.proximal_mu,
            max_steps=self.max_steps,
            seed=self.seed,
            optimizer=self.optimizer,
            betas=self.betas,
            weight_decay=self.weight_decay,
            schedule=self.schedule,
            schedule_step=self.schedule_step,
            max_grad_norm=self.max_grad_norm,
            inner=inner,
        )


def _limit_threads(node_config: Mapping[str, Any]) -> None:
    # Flower's simulation runs one ClientApp per Ray CPU; torch's default of one thread
    # per core would oversubscribe them. A deployed node can raise it (num-threads=8).
    try:
        threads = int(node_config.get("num-threads", 1))
    except (TypeError, ValueError) as err:
        raise SettingsError(f"node config 'num-threads' must be an int: {err}") from err
    if threads >= 1 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
