"""Typed, validated views of Flower's run config and node config.

Flower hands both apps a flat ``dict`` of kebab-case keys (``[tool.flwr.app.config]`` in
``pyproject.toml``, overridden by ``flwr run --run-config``). Reading it in one place
means a typo or an out-of-range value fails at start-up with a message naming the key,
rather than deep inside a training round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ConfigValue = bool | int | float | str | bytes


class SettingsError(ValueError):
    """A run-config or node-config value is missing, of the wrong type or out of range."""


def _get(config: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = config.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SettingsError(
            f"run config '{key}' must be {kind.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


@dataclass(frozen=True)
class TrainingSettings:
    """What the spine's apps read from the run config (see README "Run configuration").

    Parameters mirror the kebab-case keys of ``[tool.flwr.app.config]``.
    """

    strategy: str = "fedavg"
    dataset: str = "digits"
    model: str = "auto"
    data_dir: str = ""
    partitioning: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    shards_per_client: int = 2
    num_rounds: int = 20
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.5
    min_train_nodes: int = 2
    local_epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    results_dir: str = "results"
    run_name: str = ""
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.num_rounds < 1:
            raise SettingsError(f"num-rounds must be >= 1, got {self.num_rounds}")
        if not 0.0 < self.fraction_train <= 1.0:
            raise SettingsError(f"fraction-train must be in (0, 1], got {self.fraction_train}")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            raise SettingsError(
                f"fraction-evaluate must be in [0, 1], got {self.fraction_evaluate}"
            )
        if self.dirichlet_alpha <= 0.0:
            raise SettingsError(f"dirichlet-alpha must be > 0, got {self.dirichlet_alpha}")
        if self.local_epochs < 1:
            raise SettingsError(f"local-epochs must be >= 1, got {self.local_epochs}")
        if self.batch_size < 1:
            raise SettingsError(f"batch-size must be >= 1, got {self.batch_size}")
        if self.learning_rate <= 0.0:
            raise SettingsError(f"learning-rate must be > 0, got {self.learning_rate}")
        if self.min_train_nodes < 1:
            raise SettingsError(f"min-train-nodes must be >= 1, got {self.min_train_nodes}")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> TrainingSettings:
        """Read the settings from Flower's run config; unknown keys are left to others."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            key = field.name.replace("_", "-")
            if key in run_config:
                kind = type(field.default)
                values[field.name] = _get(run_config, key, kind, field.default)
        return cls(**values)

    @property
    def data_dir_or_none(self) -> str | None:
        """The ``data-dir`` setting, ``None`` when empty (search the usual places)."""
        return self.data_dir or None

    def results_path(self) -> Path:
        """The results folder as an absolute path (relative to the server's cwd)."""
        return Path(self.results_dir).expanduser().resolve()


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
