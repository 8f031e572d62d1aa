"""The one reader of Flower's run config (and the node config's partition and device).

Flower hands both apps a flat mapping of kebab-case keys (``[tool.flwr.app.config]`` in
``pyproject.toml``, overridden by ``flwr run --run-config``). Every key is declared
here once, in a typed section, with its default and its help line: the field
``local_epochs`` of :class:`TrainingSection` is the key ``local-epochs``. Nothing else
reads run-config keys; the apps, the engine, checkpoints, the norm guard and the
scenario runner all take a :class:`RunConfig`.

A value of the wrong type or out of range fails at start-up, naming the key; an unknown
key is named with the closest valid one (:func:`check_keys`). In a Flower app of one's
own, fedsync's keys can live in a table of their own, ``[tool.flwr.app.config.fedsync]``,
which Flower flattens to ``fedsync.<key>``: read them with
``RunConfig.from_run_config(context.run_config, prefix="fedsync.")``. A test keeps
``pyproject.toml`` and the tables in docs/ in step with :func:`declared_keys`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import torch

from fedsync.aggregation.buffer import NORMALIZATIONS
from fedsync.aggregation.schedule import CompressionSchedule
from fedsync.aggregation.server_optimizer import ServerOptimizer, build_server_optimizer
from fedsync.aggregation.shared_downlink import grid_of
from fedsync.aggregation.staleness import parse_staleness
from fedsync.compression.spec import parse_spec
from fedsync.data.partition import partition_schemes
from fedsync.data.registry import ADAMW_LEARNING_RATE, DEFAULT_TRAINING, dataset_info
from fedsync.data.types import UnknownDatasetError
from fedsync.factored import SCHEDULES as AB_SCHEDULES
from fedsync.models.registry import AUTO as AUTO_MODEL
from fedsync.models.registry import model_factory, model_names
from fedsync.models.training import (
    CLIENT_OPTIMIZERS,
    LOCAL_STEPS_POLICIES,
    OPTIMIZER_STATE_MODES,
    SCHEDULE_CLOCKS,
    LearningRateSchedule,
)
from fedsync.plugins import PluginError, is_import_path
from fedsync.records import ConfigValue

MAX_AB_RANK = 1024
"""Largest ``ab-rank`` (a tensor's rank is also capped by its own dimensions)."""

__all__ = [
    "APP_ONLY_KEYS",
    "RENAMED_KEYS",
    "AsyncSection",
    "CheckpointSection",
    "ClockSection",
    "CompressionSection",
    "ConfigValue",
    "FedAvgSection",
    "GuardSection",
    "KeyInfo",
    "NodeSection",
    "OutputSection",
    "RunConfig",
    "RuntimeSection",
    "SettingsError",
    "StopSection",
    "TrainingSection",
    "check_keys",
    "declared_keys",
    "node_partition",
    "renamed_key",
    "resolve_device",
    "settings_error",
]

_SERVER_DEVICE = re.compile(r"^(cpu|auto|cuda(:[0-9]+)?)$")
"""The values ``server-device`` takes."""


class SettingsError(ValueError):
    """A run-config or node-config value is missing, of the wrong type or out of range."""


def key(default: ConfigValue, help: str) -> Any:
    """A run-config key: its default and its one-line help (the tables in docs/)."""
    return field(default=default, metadata={"help": help})


COLLECTIVES = ("none", "allreduce", "allgather")
"""How a synchronous run's bytes are counted (run-config ``collective``)."""


def settings_error(key_name: str, why: str, value: object) -> SettingsError:
    """The error for a run-config value: ``run config 'KEY' WHY, got VALUE``."""
    return SettingsError(f"run config '{key_name}' {why}, got {value!r}")


def _fail(key_name: str, why: str, value: object) -> None:
    raise settings_error(key_name, why, value)


def _coerce(key_name: str, value: Any, kind: type) -> Any:
    # Flower's run config parses TOML: 1 and 1.0 differ, and overrides from the command
    # line arrive as the TOML literal the user typed.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SettingsError(
            f"run config '{key_name}' must be {kind.__name__}, got {value!r} "
            f"({type(value).__name__})"
        )
    return value


S = TypeVar("S", bound="Section")


@dataclass(frozen=True)
class Section:
    """Base of the typed sections: reads its own keys, validates in ``__post_init__``."""

    title: ClassVar[str] = ""

    @classmethod
    def from_run_config(cls: type[S], run_config: Mapping[str, Any]) -> S:
        """Read this section's keys; absent keys keep their defaults."""
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            name = item.name.replace("_", "-")
            if name in run_config:
                values[item.name] = _coerce(name, run_config[name], type(item.default))
        return cls(**values)

    def as_run_config(self) -> dict[str, ConfigValue]:
        """The section's values as kebab-case run-config keys."""
        return {
            item.name.replace("_", "-"): getattr(self, item.name)
            for item in dataclasses.fields(self)
        }


@dataclass(frozen=True)
class TrainingSection(Section):
    """Data, model and the clients' local training (every strategy)."""

    title: ClassVar[str] = "data, model and local training"

    dataset: str = key(
        "digits",
        "`digits` (scikit-learn's bundled 8x8 digits), `mnist`, `fashion-mnist`, "
        "`shakespeare`, `shakespeare-lm` (every position), `synthetic`; or your own loader, "
        "`package.module:loader`, called as "
        "`loader(*, seed, data_dir)` and returning `fedsync.data.DatasetSplits` (needs an "
        "explicit `model`; its `auto` training keys: "
        f"`{DEFAULT_TRAINING.partitioning}`, learning rate {DEFAULT_TRAINING.learning_rate}, "
        f"{DEFAULT_TRAINING.local_epochs} local epochs)",
    )
    model: str = key(
        "auto",
        "`mlp`, `mlp-wide` (2x512), `cnn`, `char-lstm` (2x256), `char-lstm-small` (1x128), "
        "`char-gpt` (transformer, 4x128), `char-gpt-5m` (6x256), `logreg`; or your own "
        "factory, `package.module:factory`, called as "
        "`factory(input_shape, num_classes)` and returning a `torch.nn.Module`; `auto` "
        "picks one for a bundled dataset",
    )
    data_dir: str = key(
        "",
        "where the dataset files are; empty: `$FEDSYNC_DATA`, `/usr/share/datasets/...`, "
        "`~/.cache/fedsync`",
    )
    partitioning: str = key(
        "auto",
        "`iid`, `dirichlet` (label skew), `shards` (n classes per client), "
        "`natural` (by speaker/client); `auto`: the dataset's",
    )
    dirichlet_alpha: float = key(
        0.5, "concentration of the Dirichlet label skew (smaller: more skewed)"
    )
    shards_per_client: int = key(2, "shards per client for `shards`")
    local_epochs: int = key(0, "local epochs per task; 0: the dataset's")
    local_steps: int = key(0, "cap on local optimizer steps per task (0: no cap)")
    local_steps_policy: str = key(
        "fixed",
        "fixed (every task local-steps) / speed (each device's budget scaled to its measured "
        "compute per step, the fastest keeping local-steps, at least local-steps-min; the "
        "run then stops at max-tasks x local-steps planned steps)",
    )
    local_steps_min: int = key(1, "the least step budget local-steps-policy = speed gives")
    batch_size: int = key(32, "local batch size")
    learning_rate: float = key(
        0.0, "local learning rate (SGD or AdamW); 0: the dataset's (AdamW: 0.001)"
    )
    momentum: float = key(0.9, "local SGD momentum (client-optimizer = sgd)")
    client_optimizer: str = key(
        "sgd", "local optimizer: sgd (with momentum) / adamw (DiLoCo's inner optimizer)"
    )
    client_beta1: float = key(0.9, "AdamW beta1 (client-optimizer = adamw)")
    client_beta2: float = key(0.999, "AdamW beta2 (client-optimizer = adamw)")
    client_weight_decay: float = key(
        0.0, "local weight decay: decoupled with adamw, L2 in the gradient with sgd"
    )
    client_optimizer_state: str = key(
        "reset",
        "`keep`: a device's optimizer moments and step count carry over from task to "
        "task (DiLoCo's inner optimizer; kept in `state-dir` too); `reset`: fresh each task",
    )
    client_warmup_steps: int = key(
        0, "linear learning-rate warm-up over a device's first n steps (0: none)"
    )
    client_decay_steps: int = key(
        0,
        "cosine decay of the local learning rate to `client-lr-floor` of it by a device's "
        "n-th step, warm-up included (0: no decay)",
    )
    client_lr_floor: float = key(0.1, "the fraction of the learning rate the decay ends at")
    client_schedule_clock: str = key(
        "run",
        "whose steps the warm-up and decay count: `run` (the run's progress, which every "
        "task carries: the step budgets planned so far over `concurrency`; a synchronous "
        "site's own count) / `device` (the device's own steps, however many tasks it got)",
    )
    client_grad_clip: float = key(0.0, "clip each local gradient's norm to this (0: off)")
    proximal_mu: float = key(0.0, "FedProx proximal term mu on the client (0: off)")
    seed: int = key(
        0,
        "seeds data split, partitions, model initialisation, shuffling, fleet assignment, "
        "availability and task seeds",
    )
    device: str = key(
        "auto",
        "torch device for training and, on the server, for central evaluation (`auto`: "
        "CUDA when present); a node's `device` node config wins",
    )

    def __post_init__(self) -> None:
        # An import path (a ':') is imported here, in the process reading the config, so
        # a wrong one fails before Flower starts; each app process imports it again.
        try:
            info = dataset_info(self.dataset)
        except (UnknownDatasetError, PluginError) as err:
            raise SettingsError(f"run config 'dataset': {err}") from err
        # The dataset's defaults stand in for the "auto" values (0 / "auto"); a value
        # the run config sets wins.
        auto = info.training
        if self.partitioning == "auto":
            object.__setattr__(self, "partitioning", auto.partitioning)
        if self.local_epochs == 0:
            object.__setattr__(self, "local_epochs", auto.local_epochs)
        if self.learning_rate == 0.0:
            adamw = self.client_optimizer == "adamw"
            rate = ADAMW_LEARNING_RATE if adamw else auto.learning_rate
            object.__setattr__(self, "learning_rate", rate)
        if self.partitioning not in partition_schemes():
            _fail(
                "partitioning",
                f"must be one of {', '.join(partition_schemes())} or 'auto'",
                self.partitioning,
            )
        model = self.model.strip().lower().replace("_", "-")
        if is_import_path(self.model):
            try:
                model_factory(self.model)
            except PluginError as err:
                raise SettingsError(f"run config 'model': {err}") from err
        elif model == AUTO_MODEL and info.external:
            _fail(
                "model",
                f"must be named for the import-path dataset {info.name!r} ('auto' picks a "
                f"model for a bundled dataset only): one of {', '.join(model_names())}, or "
                "your own factory, 'package.module:factory'",
                self.model,
            )
        elif model != AUTO_MODEL and model not in model_names():
            _fail(
                "model",
                f"must be one of {', '.join(model_names())}, a factory's import path "
                f"('package.module:factory') or {AUTO_MODEL!r}",
                self.model,
            )
        if self.dirichlet_alpha <= 0.0:
            _fail("dirichlet-alpha", "must be > 0", self.dirichlet_alpha)
        for name, value in (("local-epochs", self.local_epochs), ("batch-size", self.batch_size)):
            if value < 1:
                _fail(name, "must be >= 1", value)
        if self.local_steps < 0:
            _fail("local-steps", "must be >= 0 (0: no cap)", self.local_steps)
        if self.local_steps_policy not in LOCAL_STEPS_POLICIES:
            _fail(
                "local-steps-policy",
                f"must be one of {', '.join(LOCAL_STEPS_POLICIES)}",
                self.local_steps_policy,
            )
        if self.local_steps_policy == "speed" and not 1 <= self.local_steps_min <= self.local_steps:
            _fail(
                "local-steps-min",
                "must be in [1, local-steps] with local-steps-policy = speed (which needs "
                "local-steps >= 1)",
                self.local_steps_min,
            )
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0.0):
            _fail("learning-rate", "must be finite and > 0", self.learning_rate)
        if not 0.0 <= self.momentum < 1.0:
            _fail("momentum", "must be in [0, 1)", self.momentum)
        if self.client_optimizer not in CLIENT_OPTIMIZERS:
            _fail(
                "client-optimizer",
                f"must be one of {', '.join(CLIENT_OPTIMIZERS)}",
                self.client_optimizer,
            )
        for name, beta in (
            ("client-beta1", self.client_beta1),
            ("client-beta2", self.client_beta2),
        ):
            if not 0.0 <= beta < 1.0:
                _fail(name, "must be in [0, 1)", beta)
        if not (math.isfinite(self.client_weight_decay) and self.client_weight_decay >= 0.0):
            _fail("client-weight-decay", "must be finite and >= 0", self.client_weight_decay)
        if not (math.isfinite(self.proximal_mu) and self.proximal_mu >= 0.0):
            _fail("proximal-mu", "must be finite and >= 0", self.proximal_mu)
        if self.client_optimizer_state not in OPTIMIZER_STATE_MODES:
            _fail(
                "client-optimizer-state",
                f"must be one of {', '.join(OPTIMIZER_STATE_MODES)}",
                self.client_optimizer_state,
            )
        try:
            LearningRateSchedule(
                self.client_warmup_steps, self.client_decay_steps, self.client_lr_floor
            )
        except ValueError as err:
            raise SettingsError(
                "run config 'client-warmup-steps' / 'client-decay-steps' / "
                f"'client-lr-floor': {err}"
            ) from err
        if not (math.isfinite(self.client_grad_clip) and self.client_grad_clip >= 0.0):
            _fail("client-grad-clip", "must be finite and >= 0 (0: off)", self.client_grad_clip)
        if self.client_schedule_clock not in SCHEDULE_CLOCKS:
            _fail(
                "client-schedule-clock",
                f"must be one of {', '.join(SCHEDULE_CLOCKS)}",
                self.client_schedule_clock,
            )

    @property
    def optimizer_settings(self) -> dict[str, Any]:
        """The local optimizer as :func:`fedsync.models.training.train` takes it
        (``optimizer``, ``betas``, ``weight_decay``, ``schedule``, ``max_grad_norm``):
        every task of a run trains alike."""
        return {
            "optimizer": self.client_optimizer,
            "betas": (self.client_beta1, self.client_beta2),
            "weight_decay": self.client_weight_decay,
            "schedule": self.schedule,
            "max_grad_norm": self.client_grad_clip or None,
        }

    @property
    def schedule(self) -> LearningRateSchedule | None:
        """The local learning-rate schedule (``None``: a constant rate)."""
        if not (self.client_warmup_steps or self.client_decay_steps):
            return None
        return LearningRateSchedule(
            self.client_warmup_steps, self.client_decay_steps, self.client_lr_floor
        )

    @property
    def keeps_optimizer_state(self) -> bool:
        """Whether a device's optimizer moments carry over between tasks."""
        return self.client_optimizer_state == "keep"

    @property
    def data_dir_or_none(self) -> str | None:
        """The ``data-dir`` setting, ``None`` when empty (search the usual places)."""
        return self.data_dir or None


@dataclass(frozen=True)
class FedAvgSection(Section):
    """Flower's FedAvg baseline (``strategy = "fedavg"``)."""

    title: ClassVar[str] = "FedAvg"

    num_rounds: int = key(20, "rounds of FedAvg")
    fraction_train: float = key(1.0, "fraction of nodes sampled to train each round")
    fraction_evaluate: float = key(
        0.5, "fraction of nodes that evaluate on their local validation split"
    )
    min_train_nodes: int = key(2, "FedAvg waits for at least this many nodes")

    def __post_init__(self) -> None:
        if self.num_rounds < 1:
            _fail("num-rounds", "must be >= 1", self.num_rounds)
        if not 0.0 < self.fraction_train <= 1.0:
            _fail("fraction-train", "must be in (0, 1]", self.fraction_train)
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            _fail("fraction-evaluate", "must be in [0, 1]", self.fraction_evaluate)
        if self.min_train_nodes < 1:
            _fail("min-train-nodes", "must be >= 1", self.min_train_nodes)


@dataclass(frozen=True)
class AsyncSection(Section):
    """The asynchronous strategies' policy and the server optimizer."""

    title: ClassVar[str] = "asynchronous strategies"

    concurrency: int = key(5, "C: most tasks in flight at once")
    buffer_size: int = key(3, "K: updates cached per aggregation (fedasync: always 1)")
    staleness: str = key(
        "polynomial:0.5",
        "weight by staleness: constant / polynomial:a / hinge:a:b / normalized-polynomial:a:m",
    )
    max_staleness: int = key(-1, "drop updates staler than this many aggregations (-1: no limit)")
    fedasync_alpha: float = key(0.6, "FedAsync mixing alpha in (0, 1]")
    buffer_mean: str = key(
        "auto",
        "how K updates become one: auto (the strategy's) / count (sum over K, FedBuff, "
        "DiLoCo) / weight (over the summed weights, TEASQ-Fed) / selected (each coordinate "
        "over the weights of the updates that sent it, SparseLoCo); with weight and "
        "selected, weights re-balance updates but do not shrink the step",
    )
    collective: str = key(
        "none",
        "a synchronous strategy's bytes as a collective among its sites moves them: none "
        "(through the server, as sent) / allreduce (each site sends 2(C-1)/C of its payload, "
        "DiLoCo) / allgather (each site's payload to the C-1 others, SparseLoCo); the model "
        "itself then costs nothing (every site computes the same step)",
    )
    server_optimizer: str = key(
        "sgd",
        "sgd / momentum (FedAvgM) / nesterov (DiLoCo's outer step) / delayed-nesterov "
        "(asynchronous: the velocity once per server-momentum-period) / adam (FedAdam)",
    )
    server_learning_rate: float = key(
        1.0, "server (outer) learning rate eta; DiLoCo uses 0.7 with nesterov"
    )
    server_momentum: float = key(0.9, "momentum beta of momentum, nesterov and delayed-nesterov")
    server_momentum_period: int = key(
        0,
        "delayed-nesterov's N: aggregations per velocity update, plain steps of 1/N between "
        "(0: concurrency / buffer-size, rounded, at least 1: a synchronous round's worth)",
    )
    staleness_scales_step: bool = key(
        False,
        "with buffer-mean weight or selected, scale each aggregate by its K updates' mean "
        "staleness weight, so a buffer of stale updates moves the model less (count's "
        "division by K does so already)",
    )
    server_update_transform: str = key(
        "none",
        "applied to the aggregated update before the server optimizer: none / sign (DeMo's "
        "sign-of-update: every moved coordinate steps by server-learning-rate)",
    )
    server_device: str = key(
        "cpu",
        "where the server holds the global model, update buffer, optimizer state, downlink "
        "replicas and pruning masks, and decodes uplinks to: cpu / cuda / cuda:N / auto "
        "(cuda when present)",
    )

    def __post_init__(self) -> None:
        if not _SERVER_DEVICE.match(self.server_device):
            _fail("server-device", "must be cpu, cuda, cuda:N or auto", self.server_device)
        if self.concurrency < 1:
            _fail("concurrency", "must be >= 1", self.concurrency)
        if self.buffer_size < 1:
            _fail("buffer-size", "must be >= 1", self.buffer_size)
        if self.max_staleness < -1:
            _fail("max-staleness", "must be >= 0, or -1 for no limit", self.max_staleness)
        if not 0.0 < self.fedasync_alpha <= 1.0:
            _fail("fedasync-alpha", "must be in (0, 1]", self.fedasync_alpha)
        if self.collective not in COLLECTIVES:
            _fail("collective", f"must be one of {', '.join(COLLECTIVES)}", self.collective)
        if self.buffer_mean not in ("auto", *NORMALIZATIONS):
            _fail(
                "buffer-mean",
                f"must be auto or one of {', '.join(NORMALIZATIONS)}",
                self.buffer_mean,
            )
        try:
            parse_staleness(self.staleness)
            self.build_optimizer()
        except ValueError as err:
            raise SettingsError(str(err)) from err
        if self.server_momentum_period < 0:
            _fail(
                "server-momentum-period",
                "must be >= 0 (0: concurrency / buffer-size)",
                self.server_momentum_period,
            )

    def momentum_period(self, buffer_size: int | None = None) -> int:
        """Delayed Nesterov's ``N``: ``server-momentum-period``, or for ``0`` the buffers
        of ``K`` updates that make one round's worth, ``C / K`` rounded to the nearest
        int (halves to even), at least 1.

        Parameters
        ----------
        buffer_size : int, optional
            The strategy's ``K`` (DiLoCo's is ``C``, FedAsync's 1); default
            ``buffer-size``.
        """
        if self.server_momentum_period > 0:
            return self.server_momentum_period
        k = self.buffer_size if buffer_size is None else buffer_size
        return max(1, round(self.concurrency / k))

    def build_optimizer(self, *, buffer_size: int | None = None) -> ServerOptimizer:
        """The server optimizer these keys describe (``buffer_size``: the strategy's
        ``K``, for Delayed Nesterov's period; default ``buffer-size``)."""
        return build_server_optimizer(
            self.server_optimizer,
            learning_rate=self.server_learning_rate,
            momentum=self.server_momentum,
            period=self.momentum_period(buffer_size),
            transform=self.server_update_transform,
        )

    def server_torch_device(self) -> torch.device:
        """The ``server-device`` setting as the torch device this process can use.

        Checked here, on the server, not when the run config is read: the nodes read
        the same run config and need no GPU for the server's.

        Raises
        ------
        SettingsError
            When a CUDA device is asked for that torch does not see, naming the key.
        """
        name = self.server_device
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if name == "cpu" or (name == "auto" and not available):
            return torch.device("cpu")
        if name in ("auto", "cuda"):
            index = torch.cuda.current_device() if available else 0
        else:
            index = int(name.removeprefix("cuda:"))
        if index >= available:
            seen = f"{available} CUDA device(s)" if available else "no CUDA device"
            _fail("server-device", f"asks for a GPU this server lacks (torch sees {seen})", name)
        return torch.device("cuda", index)


@dataclass(frozen=True)
class CompressionSection(Section):
    """Codecs both ways and TEASQ-Fed's decaying schedule."""

    title: ClassVar[str] = "compression"

    uplink_codec: str = key(
        "topk:{density}+uniform:{bits}+ef",
        "uplink codec spec; {density} and {bits} are filled per task by the schedule",
    )
    density_start: float = key(0.1, "fraction of coordinates kept at model version 0")
    density_floor: float = key(0.02, "least fraction kept as the schedule decays")
    density_decay: float = key(
        0.04, "density decay rate per model version (0: constant; decaying strategies only)"
    )
    bits_start: int = key(8, "bits per value at model version 0")
    bits_floor: int = key(4, "least bits per value as the schedule decays")
    bits_decay: float = key(
        0.04, "bit-width decay rate per model version (0: constant; decaying strategies only)"
    )
    decay_kind: str = key("exponential", "exponential / linear / step")
    downlink_codec: str = key(
        "none+fp16",
        "codec of whole-model downlinks: a device's first task, after a lost task, or a resync",
    )
    downlink_kind: str = key(
        "delta",
        "delta (compressed difference to the model the device holds, residual kept on the "
        "server) / full (the whole model every task) / shared (one compressed change per "
        "model version for every device, one residual on the server; devices start from the "
        "seeded initial model, see downlink-seeded-start) / relay (each version's uplink "
        "payloads forwarded as they came, replayed by every device: its model is the "
        "server's, bit for bit; a device's own payloads are named by digest, not sent "
        "back; needs downlink-seeded-start)",
    )
    downlink_delta_codec: str = key(
        "none+uniform:{bits}",
        "codec of delta downlinks (downlink-kind = delta); {density} and {bits} are filled "
        "per task by the downlink schedule",
    )
    downlink_density_start: float = key(
        0.1, "downlink: fraction of the delta kept at model version 0"
    )
    downlink_density_floor: float = key(0.01, "downlink: least fraction kept as it decays")
    downlink_density_decay: float = key(
        0.0, "downlink density decay rate per model version (0: constant)"
    )
    downlink_bits_start: int = key(8, "downlink: bits per value at model version 0")
    downlink_bits_floor: int = key(
        8, "downlink: least bits per value as it decays (4-bit dense deltas diverged)"
    )
    downlink_bits_decay: float = key(
        0.0, "downlink bit-width decay rate per model version (0: constant)"
    )
    downlink_max_lag: float = key(
        0.1,
        "send a full model instead of a delta that would leave the device further than this "
        "from the global model (relative L2; 0: always full)",
    )
    downlink_max_versions: int = key(
        8,
        "shared downlink: the last this many per-version changes are kept; a device further "
        "behind, or whose missed changes outweigh a whole model, gets the whole model",
    )
    downlink_seeded_start: bool = key(
        False,
        "delta and shared downlinks, run starting at version 0: every device builds the "
        "initial model itself (fedsync.models.initial.seeded_model, the run's seed), so its "
        "first task starts from it: an empty payload at version 0, a delta against it later "
        "(digest checked; a device whose model differs fails that task and gets a whole "
        "model); false: first tasks carry the whole model (pretrained or unseeded models)",
    )
    prune_at_version: int = key(
        -1,
        "magnitude-prune the global model when it reaches this version; from then on "
        "updates both ways carry values at the kept positions only (-1: never)",
    )
    prune_sparsity: float = key(
        0.9, "fraction of each weight matrix / conv kernel pruned to zero (0 < s < 1)"
    )
    ab_rank: int = key(
        0,
        "AB-Training: train each large weight matrix as factors W = A B of this rank; a task "
        "trains A or B (the other frozen) and sends only that factor's delta (0: off)",
    )
    ab_schedule: str = key(
        "alternate",
        "AB-Training: which factor a task trains: alternate (task by task) / version (by the "
        "parity of the model version it starts from)",
    )
    ab_refactor_every: int = key(
        1, "AB-Training: split the global model into A, B by SVD again every this many versions"
    )
    ab_min_rate: float = key(
        2.0,
        "AB-Training: factor a tensor only when r * (m + n) * rate < m * n; the others (biases, "
        "small matrices) train whole",
    )

    def __post_init__(self) -> None:
        if self.prune_at_version < -1:
            _fail(
                "prune-at-version",
                "must be a model version >= 0, or -1 (never)",
                self.prune_at_version,
            )
        if not 0.0 < self.prune_sparsity < 1.0:
            _fail("prune-sparsity", "must be in (0, 1)", self.prune_sparsity)
        self._check_ab_training()
        if self.downlink_kind not in ("full", "delta", "shared", "relay"):
            _fail(
                "downlink-kind",
                "must be 'full', 'delta', 'shared' or 'relay'",
                self.downlink_kind,
            )
        if self.downlink_max_versions < 1:
            _fail("downlink-max-versions", "must be >= 1", self.downlink_max_versions)
        if self.downlink_kind == "shared":
            try:
                grid_of(self.downlink_codec)
            except ValueError as err:
                raise SettingsError(f"run config 'downlink-codec': {err}") from err
        if not self.downlink_max_lag >= 0.0:
            _fail("downlink-max-lag", "must be >= 0", self.downlink_max_lag)
        try:
            self.schedule(decaying=True)
            self.downlink_schedule(decaying=True)
        except ValueError as err:
            raise SettingsError(str(err)) from err

    def _check_ab_training(self) -> None:
        if isinstance(self.ab_rank, bool) or not 0 <= self.ab_rank <= MAX_AB_RANK:
            _fail("ab-rank", f"must be an int in [0, {MAX_AB_RANK}] (0: off)", self.ab_rank)
        if self.ab_schedule not in AB_SCHEDULES:
            _fail("ab-schedule", f"must be one of {', '.join(AB_SCHEDULES)}", self.ab_schedule)
        if self.ab_refactor_every < 1:
            _fail("ab-refactor-every", "must be >= 1 (versions)", self.ab_refactor_every)
        if not (math.isfinite(self.ab_min_rate) and self.ab_min_rate >= 1.0):
            _fail("ab-min-rate", "must be a finite number >= 1", self.ab_min_rate)
        if self.ab_rank == 0:
            return
        if self.prune_at_version >= 0:
            _fail(
                "ab-rank",
                "cannot be combined with prune-at-version (a pruned tensor has no factors)",
                self.ab_rank,
            )
        try:
            feedback = parse_spec(self.schedule(decaying=False).spec(0)).feedback
        except ValueError as err:
            raise SettingsError(str(err)) from err
        if feedback is not None:
            _fail(
                "uplink-codec",
                "must not use error feedback (+ef) with ab-rank: a residual of one factor "
                "means nothing once the frozen factor changes (every task's side or every "
                "refactor); use e.g. 'none+uniform:{bits}'",
                self.uplink_codec,
            )

    def check_codecs(self) -> None:
        """Parse every codec spec (the schedules' start values filled in) against the
        stage registry, as the engine will build them.

        Raises
        ------
        SettingsError
            Naming the key and, for a misspelled stage, the closest valid one.
        """
        for key_name, spec in (
            ("uplink-codec", self.schedule(decaying=False).spec(0)),
            ("downlink-delta-codec", self.downlink_schedule(decaying=False).spec(0)),
            ("downlink-codec", self.downlink_codec),
        ):
            try:
                parse_spec(spec)
            except ValueError as err:
                raise SettingsError(f"run config '{key_name}': {err}") from err

    def downlink_schedule(self, *, decaying: bool) -> CompressionSchedule:
        """The delta downlink's :class:`~fedsync.aggregation.schedule.CompressionSchedule`
        (its own knobs: ``downlink-density-*``, ``downlink-bits-*``)."""
        return CompressionSchedule(
            template=self.downlink_delta_codec,
            density_start=self.downlink_density_start,
            density_floor=self.downlink_density_floor,
            density_decay=self.downlink_density_decay,
            bits_start=self.downlink_bits_start,
            bits_floor=self.downlink_bits_floor,
            bits_decay=self.downlink_bits_decay,
            kind=self.decay_kind,  # type: ignore[arg-type]  # checked by the schedule
            frozen=not decaying,
        )

    def schedule(self, *, decaying: bool) -> CompressionSchedule:
        """The uplink :class:`~fedsync.aggregation.schedule.CompressionSchedule`.

        Parameters
        ----------
        decaying : bool
            Follow the decay rates (TEASQ-Fed); otherwise the start values throughout.
        """
        return CompressionSchedule(
            template=self.uplink_codec,
            density_start=self.density_start,
            density_floor=self.density_floor,
            density_decay=self.density_decay,
            bits_start=self.bits_start,
            bits_floor=self.bits_floor,
            bits_decay=self.bits_decay,
            kind=self.decay_kind,  # type: ignore[arg-type]  # checked by the schedule
            frozen=not decaying,
        )


@dataclass(frozen=True)
class ClockSection(Section):
    """Time: the virtual clock's fleet, or the wall clock of a deployment."""

    title: ClassVar[str] = "time and fleet"

    clock: str = key("virtual", "virtual (simulated time from the fleet) / wall (deployment)")
    fleet: str = key(
        "digits-stragglers",
        "fleet name in fedsync/clock/fleets (or a .toml path); empty: uniform devices",
    )
    fleet_assignment: str = key(
        "order", "order (partition-id order, else node id) / random (seeded draw)"
    )

    def __post_init__(self) -> None:
        if self.clock not in ("virtual", "wall"):
            _fail("clock", "must be 'virtual' (simulation) or 'wall' (deployment)", self.clock)
        if self.fleet_assignment not in ("order", "random"):
            _fail("fleet-assignment", "must be 'order' or 'random'", self.fleet_assignment)


@dataclass(frozen=True)
class StopSection(Section):
    """When an asynchronous run ends, and the target it reports against."""

    title: ClassVar[str] = "stopping and target"

    max_aggregations: int = key(50, "stop after this many global aggregations")
    max_sim_time: float = key(
        0.0, "stop at this simulated/wall clock time in seconds (0: no limit)"
    )
    max_wall_time: float = key(0.0, "stop after this many real seconds (0: no limit)")
    max_tasks: int = key(
        0, "stop dispatching after this many tasks (0: 20 x max-aggregations x K + C)"
    )
    target_accuracy: float = key(0.9, "accuracy whose time/bytes to reach are reported (0: none)")
    stop_at_target: bool = key(False, "end the run when target-accuracy is reached")

    def __post_init__(self) -> None:
        if self.max_aggregations < 1:
            _fail("max-aggregations", "must be >= 1", self.max_aggregations)
        if self.max_tasks < 0:
            _fail("max-tasks", "must be >= 0 (0: derived)", self.max_tasks)
        for name, number in (
            ("max-sim-time", self.max_sim_time),
            ("max-wall-time", self.max_wall_time),
        ):
            if not (math.isfinite(number) and number >= 0.0):
                _fail(name, "must be finite and >= 0", number)
        if not 0.0 <= self.target_accuracy <= 1.0:
            _fail("target-accuracy", "must be in [0, 1] (0: none)", self.target_accuracy)


@dataclass(frozen=True)
class RuntimeSection(Section):
    """How the server talks to nodes: evaluation cadence, TTLs, retries, polling."""

    title: ClassVar[str] = "runtime"

    eval_every: int = key(5, "evaluate the global model centrally every N aggregations")
    task_ttl: float = key(600.0, "Flower message TTL of a task in seconds (counted from creation)")
    max_retries: int = key(3, "consecutive failed tasks a device may retry before it is given up")
    poll_interval: float = key(0.05, "seconds between pulls when no reply is in")
    min_nodes: int = key(1, "wait for this many nodes before starting")
    node_wait: float = key(120.0, "longest wait for min-nodes, in real seconds")
    probe_timeout: float = key(
        30.0,
        "real seconds to ask nodes for their partition-id (stable device order); "
        "0: skip, order by node id",
    )

    def __post_init__(self) -> None:
        if self.eval_every < 1:
            _fail("eval-every", "must be >= 1", self.eval_every)
        if self.min_nodes < 1:
            _fail("min-nodes", "must be >= 1", self.min_nodes)
        if self.max_retries < 0:
            _fail("max-retries", "must be >= 0", self.max_retries)
        for name, number in (("task-ttl", self.task_ttl), ("poll-interval", self.poll_interval)):
            if not (math.isfinite(number) and number > 0.0):
                _fail(name, "must be finite and > 0", number)
        for name, number in (("node-wait", self.node_wait), ("probe-timeout", self.probe_timeout)):
            if not (math.isfinite(number) and number >= 0.0):
                _fail(name, "must be finite and >= 0", number)


@dataclass(frozen=True)
class OutputSection(Section):
    """Where a run's results go."""

    title: ClassVar[str] = "results"

    results_dir: str = key(
        "results",
        "parent folder of the run's results (relative to the server process's working directory)",
    )
    run_name: str = key("", "the run's folder name (empty: a timestamp)")
    plots: bool = key(True, "write accuracy PNGs (vs aggregations, time and bytes) at the end")

    def results_path(self) -> Path:
        """The results folder as an absolute path (relative to the server's cwd)."""
        return Path(self.results_dir).expanduser().resolve()


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Server checkpoints of asynchronous runs, and resuming from them."""

    title: ClassVar[str] = "checkpoints"

    checkpoint_every: int = key(
        10, "save a server checkpoint every N aggregations, and at the end (0: never)"
    )
    checkpoint_dir: str = key("", "where checkpoints go; empty: `<results-dir>/<run>/checkpoints`")
    resume: bool = key(
        False,
        "continue from the newest checkpoint there (none yet: fresh start; needs `run-name` "
        "or `checkpoint-dir`)",
    )
    resume_from: str = key(
        "", "continue from this checkpoint file, or the newest one in this folder"
    )

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            _fail("checkpoint-every", "must be >= 0 (0: never)", self.checkpoint_every)


@dataclass(frozen=True)
class GuardSection(Section):
    """The norm check on arriving updates."""

    title: ClassVar[str] = "update guard"

    max_update_norm: float = key(0.0, "reject an update whose L2 norm exceeds this (0: off)")
    norm_outlier_factor: float = key(
        100.0,
        "reject an update above this multiple of the median norm of the last accepted ones "
        "(after 5; 0: off)",
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_update_norm) and self.max_update_norm >= 0.0):
            _fail("max-update-norm", "must be >= 0", self.max_update_norm)
        factor = self.norm_outlier_factor
        if not (math.isfinite(factor) and (factor == 0.0 or factor > 1.0)):
            _fail("norm-outlier-factor", "must be 0 (off) or > 1", factor)


NODE_STATE_BACKENDS = ("context", "disk")
"""Where a node keeps its per-node arrays between tasks (``node-state``)."""


@dataclass(frozen=True)
class NodeSection(Section):
    """What a node keeps between tasks, and where (:mod:`fedsync.clientapp.node_store`);
    a node's node config may set the same keys, and wins."""

    title: ClassVar[str] = "per-node state"

    node_state: str = key(
        "context",
        "where a node keeps its error-feedback residual, last decoded model, pruning masks "
        "and inner optimizer between tasks: `context` (Flower's `context.state`: in a "
        "simulation, the simulation process's memory) / `disk` (one file per node and "
        "kind, under `state-dir`; the context keeps a token: memory bounded by the nodes "
        "training at once)",
    )
    state_dir: str = key(
        "",
        "the node's folder: named, its codec memory and inner optimizer are kept there "
        "crash-safe after every task and read back by a restarted node (usually node "
        'config); `node-state = "disk"` files go there too. Empty: nothing survives a '
        "restart, and disk files go to `fedsync-node-state` in the system's temporary "
        "folder",
    )

    def __post_init__(self) -> None:
        if self.node_state not in NODE_STATE_BACKENDS:
            _fail("node-state", f"must be one of {', '.join(NODE_STATE_BACKENDS)}", self.node_state)


SECTIONS: tuple[tuple[str, type[Section]], ...] = (
    ("training", TrainingSection),
    ("fedavg", FedAvgSection),
    ("asynchronous", AsyncSection),
    ("compression", CompressionSection),
    ("clock", ClockSection),
    ("stop", StopSection),
    ("runtime", RuntimeSection),
    ("output", OutputSection),
    ("checkpoints", CheckpointSection),
    ("guard", GuardSection),
    ("node", NodeSection),
)
"""The sections of :class:`RunConfig`, by attribute name, in docs/configuration.md's order."""

APP_ONLY_KEYS: frozenset[str] = frozenset(
    {
        "dataset",
        "model",
        "data-dir",
        "partitioning",
        "dirichlet-alpha",
        "shards-per-client",
        *FedAvgSection().as_run_config(),
    }
)
"""Keys only fedsync's own app reads (its data, its model, its FedAvg baseline): a
strategy object started from your ServerApp leaves them out of ``summary.json``."""

STRATEGY_HELP = (
    "`fedavg`: Flower's own FedAvg, dense float32 (the baseline); any other name is one of "
    "fedsync's engine strategies (`fedsync.strategies`): teasq, fedbuff, fedasync, "
    "fedasync-mix (asynchronous), diloco (synchronous rounds of `concurrency` sites)"
)


@dataclass(frozen=True)
class RunConfig:
    """The whole run config, typed: ``strategy`` plus one object per section.

    Build it with :meth:`from_run_config`; every section validates its own keys.
    """

    strategy: str = "teasq"
    training: TrainingSection = field(default_factory=TrainingSection)
    fedavg: FedAvgSection = field(default_factory=FedAvgSection)
    asynchronous: AsyncSection = field(default_factory=AsyncSection)
    compression: CompressionSection = field(default_factory=CompressionSection)
    clock: ClockSection = field(default_factory=ClockSection)
    stop: StopSection = field(default_factory=StopSection)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    output: OutputSection = field(default_factory=OutputSection)
    checkpoints: CheckpointSection = field(default_factory=CheckpointSection)
    guard: GuardSection = field(default_factory=GuardSection)
    node: NodeSection = field(default_factory=NodeSection)

    BASELINE: ClassVar[str] = "fedavg"

    def __post_init__(self) -> None:
        # The strategies read this module's sections: their registry is read at run time.
        from fedsync.strategies import STRATEGIES

        if self.strategy != self.BASELINE and self.strategy not in STRATEGIES:
            valid = ", ".join([self.BASELINE, *sorted(STRATEGIES)])
            _fail("strategy", f"must be one of {valid}", self.strategy)
        if self.runs_on_engine:
            STRATEGIES[self.strategy].check_config(self)  # what only the strategy knows
        self._check_collective()
        if not self.runs_on_engine and self.compression.ab_rank > 0:
            _fail(
                "ab-rank",
                "needs an engine strategy (teasq, fedbuff, ...); fedavg sends dense models",
                self.compression.ab_rank,
            )

    def _check_collective(self) -> None:
        """A collective's bytes hold only where every site computes the same model: a
        synchronous strategy, the model handed over exactly, nothing per site."""
        from fedsync.strategies import STRATEGIES

        collective = self.asynchronous.collective
        if collective == "none":
            return
        if not (self.runs_on_engine and STRATEGIES[self.strategy].synchronous):
            _fail(
                "collective",
                "needs a synchronous engine strategy (diloco): asynchronous sites exchange "
                "updates through the server",
                collective,
            )
        compression = self.compression
        exact = parse_spec(compression.downlink_codec)
        if compression.downlink_kind != "full" or not (
            exact.sparsifier is not None
            and exact.sparsifier.name == "none"
            and exact.rotation is None
            and exact.feedback is None
            and exact.quantizer is not None
            and exact.quantizer.name == "fp32"
        ):
            _fail(
                "collective",
                "counts no model download, so the model must reach the sites exactly: "
                'downlink-kind = "full" with downlink-codec = "none+fp32" (got '
                f"{compression.downlink_kind!r}, {compression.downlink_codec!r})",
                collective,
            )
        if compression.ab_rank > 0 or compression.prune_at_version >= 0:
            _fail(
                "collective",
                "cannot count per-site payloads (AB-Training's factors, pruning masks)",
                collective,
            )

    @classmethod
    def from_run_config(
        cls, run_config: Mapping[str, Any], *, prefix: str = "", **sections: Any
    ) -> RunConfig:
        """Read every declared key of ``run_config``.

        Without ``prefix``, undeclared keys are ignored here (:func:`check_keys` names
        them). With one, fedsync's keys live under it beside the user's own: Flower
        flattens ``[tool.flwr.app.config.fedsync]`` with ``buffer-size = 5`` to the key
        ``fedsync.buffer-size``, read with ``prefix="fedsync."``. Then only keys that start
        with the prefix are read (prefix stripped), every one of them must be declared,
        and keys without it are the user's and ignored entirely.

        Parameters
        ----------
        run_config : mapping
            Flower's ``context.run_config`` (or a scenario's merged settings).
        prefix : str
            Where fedsync's keys start, with its separator (``"fedsync."``); empty: every
            key is a candidate.
        **sections
            Section objects that replace what the run config says (tests).

        Raises
        ------
        SettingsError
            A value of the wrong type or out of range; with a prefix, also a prefixed key
            that is not declared (named in full, with the closest valid one).
        """
        if prefix:
            run_config = {
                name.removeprefix(prefix): value
                for name, value in run_config.items()
                if name.startswith(prefix)
            }
            check_keys(run_config, prefix=prefix)
        strategy = _coerce("strategy", run_config.get("strategy", cls.strategy), str)
        built: dict[str, Any] = {name: kind.from_run_config(run_config) for name, kind in SECTIONS}
        built.update(sections)
        return cls(strategy=strategy, **built)

    @classmethod
    def of(cls, **values: Any) -> RunConfig:
        """A config from snake_case values (``RunConfig.of(strategy="teasq", buffer_size=2)``),
        the programmatic twin of :meth:`from_run_config`; an unknown name is an error."""
        run_config = {k.replace("_", "-"): v for k, v in values.items()}
        check_keys(run_config)
        return cls.from_run_config(run_config)

    @property
    def runs_on_engine(self) -> bool:
        """Whether the strategy runs on fedsync's engine: true for every strategy of
        :data:`fedsync.strategies.STRATEGIES` (the synchronous diloco among them), which
        send compressed tasks and stop after
        ``max-aggregations``; false for Flower's own FedAvg (:attr:`BASELINE`), which
        sends dense models and stops after ``num-rounds``."""
        return self.strategy != self.BASELINE

    def as_run_config(self) -> dict[str, ConfigValue]:
        """Every key with its value (for logs, summaries and checkpoints)."""
        out: dict[str, ConfigValue] = {"strategy": self.strategy}
        for name, _ in SECTIONS:
            out.update(getattr(self, name).as_run_config())
        return out


@dataclass(frozen=True)
class KeyInfo:
    """One declared run-config key."""

    key: str
    default: ConfigValue
    help: str
    section: str


def declared_keys() -> dict[str, KeyInfo]:
    """Every run-config key, in declaration order, with its default and help."""
    keys = {"strategy": KeyInfo("strategy", RunConfig.strategy, STRATEGY_HELP, "strategy")}
    for _, kind in SECTIONS:
        for item in dataclasses.fields(kind):
            name = item.name.replace("_", "-")
            default = cast(ConfigValue, item.default)
            keys[name] = KeyInfo(name, default, item.metadata["help"], kind.title)
    return keys


RENAMED_KEYS: Mapping[str, str] = {"node-state-dir": "state-dir"}
"""Keys an earlier fedsync read, by the key that took their place."""


def renamed_key(name: str, *, prefix: str = "") -> SettingsError:
    """The error for a key by its old name (:data:`RENAMED_KEYS`)."""
    return SettingsError(
        f"run-config key '{prefix}{name}' is now '{prefix}{RENAMED_KEYS[name]}' "
        "(docs/operations.md)"
    )


def check_keys(keys: Iterable[str], *, prefix: str = "", owner: str = "") -> None:
    """Raise :class:`SettingsError` for a key that is not declared, naming the closest one.

    Parameters
    ----------
    keys : iterable of str
        Key names, without ``prefix`` (snake_case Python arguments with ``owner``).
    prefix : str
        Where the keys came from in the run config (``"fedsync."``): the message names
        the key and the suggestion as the user wrote them, ``'fedsync.bufer-size'``.
    owner : str
        The class whose keyword arguments ``keys`` are (``"TEASQ"``): names and the
        suggestion are then in snake_case, ``TEASQ() got an unknown argument``.
    """
    known = [name.replace("-", "_") if owner else name for name in declared_keys()]
    shown = "" if owner else prefix
    for name in keys:
        if name in known:
            continue
        if name in RENAMED_KEYS and not owner:
            raise renamed_key(name, prefix=prefix)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{shown}{close[0]}'?" if close else ""
        what = f"{owner}() got an unknown argument" if owner else "unknown run-config key"
        raise SettingsError(f"{what} '{shown}{name}'{hint}")


# --- devices and nodes --------------------------------------------------------------------------
def resolve_device(requested: str) -> torch.device:
    """Turn a ``device`` setting into a torch device.

    ``"auto"`` (or empty) picks CUDA when this process can see a GPU and CPU otherwise,
    so the same node config serves CPU boards and GPU boxes.

    Raises
    ------
    SettingsError
        When a CUDA device is asked for and none is present (say so instead of
        failing later inside training).
    """
    name = requested.strip().lower()
    if name in ("", "auto"):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise SettingsError(f"device {requested!r} is not a torch device: {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError(f"device {requested!r} asked for, but torch sees no CUDA device")
    return device


def node_partition(node_config: Mapping[str, Any]) -> tuple[int, int]:
    """Read ``partition-id`` and ``num-partitions`` from a node config.

    Flower's simulation engine sets both; a deployed SuperNode gets them from
    ``--node-config``.
    """
    try:
        partition_id = int(node_config["partition-id"])
        num_partitions = int(node_config["num-partitions"])
    except KeyError as err:
        raise SettingsError(
            f"node config lacks {err.args[0]!r}: start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from err
    if not 0 <= partition_id < num_partitions:
        raise SettingsError(
            f"partition-id must be in [0, num-partitions={num_partitions}), got {partition_id}"
        )
    return partition_id, num_partitions
