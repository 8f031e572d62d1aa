"""The asynchronous server's settings, read from Flower's run config (kebab-case keys).

One frozen dataclass, grouped by role; every field's run-config key is its name with
``_`` replaced by ``-`` (``buffer_size`` <- ``buffer-size``). Keys the run config lacks
keep their defaults; values of the wrong type or out of range fail at start-up with a
message naming the key. The builders (:meth:`AsyncConfig.build_policy`,
:meth:`AsyncConfig.build_schedule`, :meth:`AsyncConfig.build_optimizer`) turn the numbers
into the objects the loop runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from fedsync.aggregation.policies import POLICIES, AsyncPolicy, build_policy
from fedsync.aggregation.schedule import DEFAULT_UPLINK_TEMPLATE, CompressionSchedule, DecayKind
from fedsync.aggregation.server_optimizer import ServerOptimizer, build_server_optimizer
from fedsync.aggregation.staleness import parse_staleness

__all__ = ["CONFIG_DOCS", "AsyncConfig", "AsyncConfigError"]


class AsyncConfigError(ValueError):
    """A run-config value for the asynchronous server is missing, mistyped or out of range."""


@dataclass(frozen=True)
class AsyncConfig:
    """Settings of one asynchronous run (TEASQ-Fed, FedBuff, FedAsync).

    See :data:`CONFIG_DOCS` for one line per key.
    """

    # --- policy ---------------------------------------------------------------------------
    strategy: str = "teasq"
    concurrency: int = 5
    buffer_size: int = 3
    staleness: str = "polynomial:0.5"
    max_staleness: int = -1
    fedasync_alpha: float = 0.6
    # --- server optimizer -----------------------------------------------------------------
    server_optimizer: str = "sgd"
    server_learning_rate: float = 1.0
    server_momentum: float = 0.9
    # --- uplink compression (TEASQ-Fed's decaying schedule) --------------------------------
    uplink_codec: str = DEFAULT_UPLINK_TEMPLATE
    density_start: float = 0.1
    density_floor: float = 0.01
    density_decay: float = 0.0
    bits_start: int = 8
    bits_floor: int = 4
    bits_decay: float = 0.0
    decay_kind: str = "exponential"
    # --- downlink compression -------------------------------------------------------------
    downlink_codec: str = "none+fp16"
    downlink_kind: str = "full"
    downlink_delta_codec: str = "none+uniform:8"
    # --- the client's task (shared keys with the FedAvg baseline) ---------------------------
    local_epochs: int = 1
    local_steps: int = 0
    learning_rate: float = 0.05
    momentum: float = 0.9
    batch_size: int = 32
    proximal_mu: float = 0.0
    # --- time -----------------------------------------------------------------------------
    clock: str = "virtual"
    fleet: str = ""
    fleet_assignment: str = "order"
    seed: int = 0
    # --- when to stop ---------------------------------------------------------------------
    max_aggregations: int = 50
    max_sim_time: float = 0.0
    max_wall_time: float = 0.0
    max_tasks: int = 0
    target_accuracy: float = 0.0
    stop_at_target: bool = False
    # --- evaluation and robustness --------------------------------------------------------
    eval_every: int = 5
    task_ttl: float = 600.0
    max_retries: int = 3
    poll_interval: float = 0.05
    min_nodes: int = 1
    node_wait: float = 120.0
    probe_timeout: float = 30.0
    plots: bool = True

    def __post_init__(self) -> None:
        def fail(key: str, why: str, value: object) -> None:
            raise AsyncConfigError(f"run config '{key}' {why}, got {value!r}")

        if self.strategy not in POLICIES:
            fail(
                "strategy",
                f"must be one of {', '.join(POLICIES)} for the async loop",
                self.strategy,
            )
        if self.max_staleness < -1:
            fail("max-staleness", "must be >= 0, or -1 for no limit", self.max_staleness)
        if self.downlink_kind not in ("full", "delta"):
            fail("downlink-kind", "must be 'full' or 'delta'", self.downlink_kind)
        if self.clock not in ("virtual", "wall"):
            fail("clock", "must be 'virtual' (simulation) or 'wall' (deployment)", self.clock)
        if self.fleet_assignment not in ("order", "random"):
            fail("fleet-assignment", "must be 'order' or 'random'", self.fleet_assignment)
        for key, value in (("local-epochs", self.local_epochs), ("batch-size", self.batch_size)):
            if value < 1:
                fail(key, "must be >= 1", value)
        for key, value in (("local-steps", self.local_steps), ("max-tasks", self.max_tasks)):
            if value < 0:
                fail(key, "must be >= 0 (0: no cap)", value)
        if self.max_aggregations < 1:
            fail("max-aggregations", "must be >= 1", self.max_aggregations)
        if self.eval_every < 1:
            fail("eval-every", "must be >= 1", self.eval_every)
        if self.min_nodes < 1:
            fail("min-nodes", "must be >= 1", self.min_nodes)
        for key, number in (
            ("learning-rate", self.learning_rate),
            ("task-ttl", self.task_ttl),
            ("poll-interval", self.poll_interval),
        ):
            if not (math.isfinite(number) and number > 0.0):
                fail(key, "must be finite and > 0", number)
        for key, number in (
            ("proximal-mu", self.proximal_mu),
            ("max-sim-time", self.max_sim_time),
            ("max-wall-time", self.max_wall_time),
            ("node-wait", self.node_wait),
            ("probe-timeout", self.probe_timeout),
        ):
            if not (math.isfinite(number) and number >= 0.0):
                fail(key, "must be finite and >= 0", number)
        if not 0.0 <= self.target_accuracy <= 1.0:
            fail("target-accuracy", "must be in [0, 1] (0: none)", self.target_accuracy)
        if not 0.0 <= self.momentum < 1.0:
            fail("momentum", "must be in [0, 1)", self.momentum)
        # Build once so every composite value (staleness spec, policy, schedule,
        # optimizer) is checked now rather than at the first arrival.
        try:
            parse_staleness(self.staleness)
            self.build_policy()
            self.build_schedule()
            self.build_optimizer()
        except ValueError as err:
            raise AsyncConfigError(str(err)) from err

    # --- reading ------------------------------------------------------------------------------
    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **overrides: Any) -> AsyncConfig:
        """Read every known key from ``run_config`` (others are left to other readers).

        Parameters
        ----------
        run_config : mapping
            Flower's ``context.run_config``.
        **overrides
            Field values that win over the run config (tests, programmatic runs).
        """
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            key = field.name.replace("_", "-")
            if key in run_config:
                values[field.name] = _coerce(key, run_config[key], type(field.default))
        values.update(overrides)
        return cls(**values)

    def as_run_config(self) -> dict[str, Any]:
        """The settings as kebab-case run-config keys (for logs and summaries)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}

    # --- builders -----------------------------------------------------------------------------
    def build_policy(self) -> AsyncPolicy:
        """The policy the ``strategy`` key names, with this config's numbers."""
        return build_policy(
            self.strategy,
            concurrency=self.concurrency,
            buffer_size=self.buffer_size,
            staleness=self.staleness,
            max_staleness=None if self.max_staleness < 0 else self.max_staleness,
            fedasync_alpha=self.fedasync_alpha,
        )

    def build_schedule(self) -> CompressionSchedule:
        """The uplink compression schedule (frozen unless the policy decays it)."""
        return CompressionSchedule(
            template=self.uplink_codec,
            density_start=self.density_start,
            density_floor=self.density_floor,
            density_decay=self.density_decay,
            bits_start=self.bits_start,
            bits_floor=self.bits_floor,
            bits_decay=self.bits_decay,
            kind=cast(DecayKind, self.decay_kind),  # checked by the schedule
            frozen=not build_policy(self.strategy).decaying_compression,
        )

    def build_optimizer(self) -> ServerOptimizer:
        """A fresh server optimizer (``server-optimizer`` names it)."""
        return build_server_optimizer(
            self.server_optimizer,
            learning_rate=self.server_learning_rate,
            momentum=self.server_momentum,
        )


def _coerce(key: str, value: Any, kind: type) -> Any:
    # Flower's run config parses TOML: 1 and 1.0 differ, and overrides from the command
    # line arrive as the TOML literal the user typed.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AsyncConfigError(
            f"run config '{key}' must be {kind.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


CONFIG_DOCS: dict[str, str] = {
    "strategy": "teasq | fedbuff | fedasync select the async loop (fedavg: Flower's FedAvg)",
    "concurrency": "C: most tasks in flight at once",
    "buffer-size": "K: updates cached per aggregation (fedasync: always 1)",
    "staleness": "weight by staleness: constant | polynomial:a | hinge:a:b"
    " | normalized-polynomial:a:m",
    "max-staleness": "drop updates staler than this many aggregations (-1: no limit)",
    "fedasync-alpha": "FedAsync mixing alpha in (0, 1]",
    "server-optimizer": "sgd | momentum (FedAvgM) | adam (FedAdam)",
    "server-learning-rate": "server learning rate eta",
    "server-momentum": "FedAvgM momentum beta",
    "uplink-codec": "uplink codec spec; {density} and {bits} are filled per task by the schedule",
    "density-start": "fraction of coordinates kept at model version 0",
    "density-floor": "least fraction kept as the schedule decays",
    "density-decay": "density decay rate per model version (0: constant; teasq only)",
    "bits-start": "bits per value at model version 0",
    "bits-floor": "least bits per value as the schedule decays",
    "bits-decay": "bit-width decay rate per model version (0: constant; teasq only)",
    "decay-kind": "exponential | linear | step",
    "downlink-codec": "codec of whole-model downlinks (e.g. none+fp16)",
    "downlink-kind": "full (whole model each task) | delta (compressed delta vs the device's copy)",
    "downlink-delta-codec": "codec of delta downlinks (downlink-kind = delta)",
    "local-epochs": "local epochs per task",
    "local-steps": "cap on local optimizer steps per task (0: no cap)",
    "learning-rate": "client learning rate",
    "momentum": "client SGD momentum",
    "batch-size": "client batch size",
    "proximal-mu": "FedProx proximal term mu on the client (0: off)",
    "clock": "virtual (simulated time from the fleet) | wall (deployment)",
    "fleet": "fleet name in simulations/fleets (or a .toml path); empty: uniform devices",
    "fleet-assignment": "order (partition-id order, else node id) | random (seeded draw)",
    "seed": "seed of fleet assignment, availability, dropout and task seeds",
    "max-aggregations": "stop after this many global aggregations",
    "max-sim-time": "stop at this simulated/wall clock time in seconds (0: no limit)",
    "max-wall-time": "stop after this many real seconds (0: no limit)",
    "max-tasks": "stop dispatching after this many tasks (0: 20 x max-aggregations x K + C)",
    "target-accuracy": "accuracy whose time/bytes to reach are reported (0: none)",
    "stop-at-target": "end the run when target-accuracy is reached",
    "eval-every": "evaluate the global model centrally every N aggregations",
    "task-ttl": "Flower message TTL of a task in seconds (counted from creation)",
    "max-retries": "consecutive failed tasks a device may retry before it is given up",
    "poll-interval": "seconds between pulls when no reply is in",
    "min-nodes": "wait for this many nodes before starting",
    "node-wait": "longest wait for min-nodes, in real seconds",
    "probe-timeout": "real seconds to ask nodes for their partition-id (stable device order);"
    " 0: skip, order by node id",
    "plots": "write accuracy PNGs (vs aggregations, time and bytes) at the end",
}
"""One line per run-config key of :class:`AsyncConfig` (for the README and pyproject)."""
