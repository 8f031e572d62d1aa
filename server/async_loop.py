"""The asynchronous server loop (TEASQ-Fed, FedBuff, FedAsync) on Flower's Grid Message API.

No rounds: idle devices apply for work, at most ``C`` tasks are in flight, and each
reply is aggregated on its own schedule::

    wake(node) -> scheduler queue -> dispatch: encode downlink, push TRAIN message
    pull_messages (non-blocking) -> clock.reply / clock.error
    clock.pop() -> reply event: decode -> validate -> staleness gate -> buffer.add
                -> K cached? take -> server optimizer -> version + 1 -> evaluate every N
                -> wake(node): the device applies again

The clock (:mod:`fedsync.clock`) decides when things happen: in simulation a
:class:`~fedsync.clock.VirtualClock` releases replies in simulated-time order (real
ClientApps still run in parallel in Flower's simulation engine), in deployment a
:class:`~fedsync.clock.WallClock` releases them as they come. Nothing below the
``clock.pop()`` line knows which.

The message a ClientApp receives (names in :mod:`fedsync.protocol`):

* ``DOWNLINK`` ArrayRecord, ``PAYLOAD``: one uint8 array, an encoded frame. With
  ``downlink-kind = "full"`` in CONFIG it decodes to the whole model (floating-point
  tensors); with ``"delta"`` to a difference to add to the model this node last
  received (kept in ``context.state``).
* ``CONFIG`` ConfigRecord: ``model-version``, ``server-round`` (= model version),
  ``local-epochs``, ``local-steps``, ``learning-rate``, ``momentum``, ``batch-size``,
  ``proximal-mu``, ``uplink-codec`` (the task's spec string, density and bits filled
  in), ``downlink-kind``, ``task-seed``.

and must reply with ``UPLINK`` ArrayRecord ``PAYLOAD`` (the encoded delta: local model
minus the start model it decoded, error feedback applied on the client) and
``METRICS`` (``num-examples``, ``num-steps``, ``train-loss``, ``compute-seconds``,
``uplink-bytes``). Replies that do not decode, do not fit the model, carry NaN/Inf or
have an absurd L2 norm (:mod:`server.update_guard`) are rejected and counted; the global
model is never touched by them. The CONFIG also names the training job
(:data:`fedsync.persist.JOB_KEY`), which nodes key their persisted codec state by.

Every ``checkpoint-every`` aggregations the loop hands an :class:`AsyncCheckpoint` to
``checkpoint_fn``; :func:`run_async_strategy` writes them with
:class:`server.checkpoint.CheckpointStore` and resumes from them (``resume=true``).

Before the first task the loop sends each node one QUERY message (CONFIG
``fedsync-probe = 1``) and expects METRICS ``partition-id`` (from the node config) back:
Flower draws node ids at random in every simulation, and the partition id gives each
device a stable index, so fleet assignment, application order and seeded draws repeat
from run to run. A node that errors or stays silent for ``probe-timeout`` s is ordered
after the others by node id.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    ConfigRecordValues,
    Context,
    Message,
    MessageType,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedsync import protocol
from fedsync.aggregation import (
    DeviceState,
    InvalidUpdate,
    TaskScheduler,
    UpdateBuffer,
    validate_update,
)
from fedsync.aggregation.config import CONFIG_DOCS, AsyncConfig, AsyncConfigError
from fedsync.aggregation.downlink import (
    CodecFactory,
    DownlinkEncoder,
    DownlinkKind,
    UpdateCodecLike,
)
from fedsync.aggregation.progress import RunTally
from fedsync.clock import Clock, ClockEvent, Fleet, TaskWork, VirtualClock, WallClock, load_fleet
from fedsync.clock.fleet import Assignment
from fedsync.persist import JOB_KEY
from fedsync.reports import RunRecorder, plot_run
from fedsync.settings import resolve_device
from fedsync.updates import SparseUpdate, TensorSpec
from server.checkpoint import (
    AsyncCheckpoint,
    CheckpointSettings,
    check_fits,
    restore_tally,
    tally_state,
)
from server.probe import probe_partitions
from server.update_guard import UpdateNormGuard, update_norm

__all__ = [
    "CONFIG_DOCS",
    "AsyncCheckpoint",
    "AsyncConfig",
    "AsyncConfigError",
    "AsyncResult",
    "default_codec_factory",
    "run_async",
    "run_async_strategy",
]

EvaluateFn = Callable[[dict[str, torch.Tensor]], dict[str, float]]

ERROR_NAMES = {
    2: "clientapp-exception",
    3: "ttl-expired",
    4: "reply-expired",
    5: "node-unavailable",
    8: "clientapp-crashed",
}
"""Flower 1.39 error codes seen on replies (see FLOWER.md)."""

_TTL_GRACE_S = 10.0
"""Extra real seconds past a task's TTL before the loop stops waiting for its reply
(Flower normally answers an expired task with error code 3 itself)."""

_NODE_REFRESH_S = 10.0
"""How often (real seconds) the wall-clock loop looks for SuperNodes that joined or
came back (one cheap ``get_node_ids`` call)."""

_GONE_FAILURES = ("node-unavailable",)
"""Failures that mean the node left: the SuperLink marked it offline (missed
heartbeats). A device given up for them is taken back when it is online again: with
SuperNode authentication a restarted node keeps its node id (FLOWER.md)."""


@dataclass
class AsyncResult:
    """What :func:`run_async` returns.

    Attributes
    ----------
    global_state : dict of str to torch.Tensor
        The final global model (every tensor of the state dict given).
    version : int
        Aggregations done (including those before a resume).
    optimizer_state : dict
        The server optimizer's state, for a checkpoint.
    summary : dict
        What was written to ``summary.json``.
    evaluations : list of dict
        Every central evaluation (version, accuracy, loss, sim_time, cumulative bytes).
    """

    global_state: dict[str, torch.Tensor]
    version: int
    optimizer_state: dict[str, Any]
    summary: dict[str, Any]
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    def checkpoint(self, sim_time: float = 0.0) -> AsyncCheckpoint:
        """The result as a checkpoint to resume from."""
        return AsyncCheckpoint(
            self.version,
            self.global_state,
            self.optimizer_state,
            sim_time,
            int(self.summary.get("total_bytes_up", 0)),
            int(self.summary.get("total_bytes_down", 0)),
        )


def default_codec_factory(spec: str, *, seed: int = 0) -> UpdateCodecLike:
    """Build :class:`fedsync.codec.UpdateCodec` from a spec string.

    ``seed`` fixes the random choices of stochastic codecs (random-k, stochastic
    rounding) the server encodes downlinks with; decoding needs no seed.
    """
    from fedsync.codec import UpdateCodec  # imported late: the core loads without it

    codec: UpdateCodecLike = UpdateCodec(spec, seed=seed)
    return codec


def run_async(
    grid: Grid,
    context: Context,
    *,
    recorder: RunRecorder,
    global_state: Mapping[str, torch.Tensor],
    evaluate_fn: EvaluateFn,
    config: AsyncConfig | None = None,
    codec_factory: CodecFactory | None = None,
    clock: Clock | None = None,
    resume: AsyncCheckpoint | None = None,
    checkpoint_fn: Callable[[AsyncCheckpoint], object] | None = None,
    checkpoint_every: int = 0,
    norm_guard: UpdateNormGuard | None = None,
    sleep: Callable[[float], None] = time.sleep,
    device: str | torch.device = "cpu",
) -> AsyncResult:
    """Run TEASQ-Fed, FedBuff or FedAsync over the Grid until a stop condition.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Flower's Grid (``push_messages`` / ``pull_messages`` / ``get_node_ids``).
    context : flwr.app.Context
        The ServerApp context; its run config is read when ``config`` is None.
    recorder : RunRecorder
        Where events, ``summary.json`` and plots go.
    global_state : mapping of str to torch.Tensor
        The initial global model (a state dict; floating-point tensors are trained,
        the others are passed through unchanged).
    evaluate_fn : callable
        ``state -> {"accuracy": ..., "loss": ..., ...}``, the central evaluation.
    config : AsyncConfig, optional
        Settings; default ``AsyncConfig.from_run_config(context.run_config)``.
    codec_factory : callable, optional
        Spec string -> codec; default :func:`default_codec_factory`.
    clock : Clock, optional
        Overrides the clock the ``clock`` setting would build (tests).
    resume : AsyncCheckpoint, optional
        Continue from a checkpoint (model, optimizer state, version, counters, job).
    checkpoint_fn : callable, optional
        Called with an :class:`AsyncCheckpoint` every ``checkpoint_every``
        aggregations and at the end; with ``checkpoint_every = 0``, after every
        central evaluation instead.
    checkpoint_every : int
        Aggregations between checkpoints (0: at evaluations, see above).
    norm_guard : UpdateNormGuard, optional
        Rejects updates of absurd L2 norm; none: no norm check.
    sleep : callable
        How to wait between empty pulls (tests pass a no-op).
    device : str or torch.device
        Where the aggregation buffer lives: decoded sparse updates are scatter-added
        there (the Triton kernel for a CUDA device, see :mod:`kernels.triton`); the
        global model and the server optimizer stay on the host.

    Returns
    -------
    AsyncResult
    """
    if config is None:
        config = AsyncConfig.from_run_config(context.run_config)
    loop = AsyncLoop(
        grid,
        config,
        recorder=recorder,
        global_state=global_state,
        evaluate_fn=evaluate_fn,
        codec_factory=codec_factory or partial(default_codec_factory, seed=config.seed),
        clock=clock,
        resume=resume,
        checkpoint_fn=checkpoint_fn,
        checkpoint_every=checkpoint_every,
        norm_guard=norm_guard,
        sleep=sleep,
        device=device,
    )
    return loop.run()


def run_async_strategy(
    grid: Grid, context: Context, settings: Any, recorder: RunRecorder, evaluator: Any
) -> dict[str, Any]:
    """Adapter to ``server.registry.StrategyRunner``: the run config decides the policy.

    ``evaluator`` is a ``server.evaluation.CentralEvaluator`` (``initial_state()`` and
    ``__call__(state)``); ``settings`` is unused beyond what the run config holds.
    Checkpoints and resuming follow the run config (:mod:`server.checkpoint`), the
    norm check too (:mod:`server.update_guard`).
    """
    run_config = context.run_config
    persistence = CheckpointSettings.from_run_config(run_config)
    store = persistence.store(recorder.folder)
    initial = evaluator.initial_state()
    found = persistence.find_resume(store, run_name=str(run_config.get("run-name", "")))
    resume = None
    if found is not None:
        path, resume = found
        check_fits(resume, initial)
        recorder.events.write("resume", checkpoint=str(path), version=resume.version)
    result = run_async(
        grid,
        context,
        recorder=recorder,
        global_state=initial,
        evaluate_fn=evaluator,
        config=AsyncConfig.from_run_config(run_config),
        resume=resume,
        checkpoint_fn=store.save if persistence.every > 0 else None,
        checkpoint_every=persistence.every,
        norm_guard=UpdateNormGuard.from_run_config(run_config),
        # The run's ``device`` ("auto": CUDA when the server sees one) also hosts the
        # aggregation buffer, so a GPU server scatter-adds there.
        device=resolve_device(str(run_config.get("device", "auto"))),
    )
    result.summary["checkpoints"] = {
        "every": persistence.every,
        "folder": str(store.folder) if persistence.every > 0 else None,
        "resumed_from": str(found[0]) if found is not None else None,
    }
    return result.summary


@dataclass
class _Task:
    """One task from dispatch to its outcome."""

    task_id: str
    node_id: int
    version: int
    uplink_spec: str
    downlink_bytes: int
    dispatch_time: float
    message_id: str = ""
    pushed_at: float = 0.0
    payload: bytes = b""
    metrics: dict[str, float] = field(default_factory=dict)
    malformed: str = ""


class AsyncLoop:
    """The state of one asynchronous run; :meth:`run` drives it to the end.

    Use :func:`run_async`; the constructor's parameters are the same.
    """

    def __init__(
        self,
        grid: Grid,
        config: AsyncConfig,
        *,
        recorder: RunRecorder,
        global_state: Mapping[str, torch.Tensor],
        evaluate_fn: EvaluateFn,
        codec_factory: CodecFactory,
        clock: Clock | None = None,
        resume: AsyncCheckpoint | None = None,
        checkpoint_fn: Callable[[AsyncCheckpoint], object] | None = None,
        checkpoint_every: int = 0,
        norm_guard: UpdateNormGuard | None = None,
        sleep: Callable[[float], None] = time.sleep,
        device: str | torch.device = "cpu",
    ) -> None:
        self.grid = grid
        self.config = config
        self.recorder = recorder
        self.evaluate_fn = evaluate_fn
        self.checkpoint_fn = checkpoint_fn
        self.checkpoint_every = checkpoint_every
        self.norm_guard = norm_guard
        self._sleep = sleep
        self._clock_override = clock
        # --- what the policy needs ---
        self.policy = config.build_policy()
        self.schedule = config.build_schedule()
        self.optimizer = config.build_optimizer()
        # --- the global model: float tensors are trained, the rest passed through ---
        start = resume.global_state if resume is not None else global_state
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in start.items()}
        self.trained = {k: v for k, v in self.state.items() if v.is_floating_point()}
        if not self.trained:
            raise ValueError("global_state has no floating-point tensors to train")
        self.specs = {
            name: TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
            for name, t in self.trained.items()
        }
        self.version = resume.version if resume is not None else 0
        if resume is not None:
            self.optimizer.load_state_dict(resume.optimizer_state)
        self._time_offset = resume.sim_time if resume is not None else 0.0
        # --- codecs (built once per spec; the uplink ones checked now, not mid-run) ---
        self._codec_factory = codec_factory
        self._codecs: dict[str, UpdateCodecLike] = {}
        for spec in self.schedule.extreme_specs():
            self._codec(spec)
        self.downlink = DownlinkEncoder(
            self.specs,
            full_codec=self._downlink_codec(config.downlink_codec),
            kind=cast(DownlinkKind, config.downlink_kind),
            delta_codec=(
                self._downlink_codec(config.downlink_delta_codec)
                if config.downlink_kind == "delta"
                else None
            ),
        )
        self.buffer = UpdateBuffer(
            self.specs,
            capacity=self.policy.buffer_size,
            normalization=self.policy.normalization,
            device=device,
        )
        # --- bookkeeping ---
        self.tally = RunTally(target_accuracy=config.target_accuracy)
        self.rejections: Counter[str] = Counter()
        """Rejected replies by what was wrong (decode error class, invalid, norm)."""
        self.tasks: dict[str, _Task] = {}
        self._by_message: dict[str, str] = {}
        self._task_counter = 0
        # --- continuity across a server restart (see server.checkpoint) ---
        self.resumed = resume
        self.job_id = uuid.uuid4().hex[:16]
        self._wall_before = 0.0
        self._last_checkpoint_version = -1
        if resume is not None:
            self.tally.bytes_up, self.tally.bytes_down = resume.bytes_up, resume.bytes_down
            restore_tally(self.tally, resume.tally)
            # Task ids and seeds go on instead of repeating; max-tasks counts the job.
            self._task_counter = resume.tasks_dispatched
            self.job_id = resume.job_id or self.job_id
            self._wall_before = resume.wall_time
            self._last_checkpoint_version = resume.version
        self._max_tasks = config.max_tasks or (
            20 * config.max_aggregations * self.policy.buffer_size + self.policy.concurrency
        )
        self._wall_start = time.monotonic()
        self._last_eval_version = -1
        self._last_node_refresh = 0.0
        self.stop_reason = ""
        self._time_cap = float("inf")
        # --- built by run(), once the nodes are known ---
        self.fleet: Fleet
        self.clock: Clock
        self.scheduler: TaskScheduler
        self.device_of: dict[int, int] = {}
        """Flower node id -> stable device index (partition id order)."""

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> AsyncResult:
        """Dispatch, collect and aggregate until a stop condition; write the summary."""
        node_ids = self._discover_nodes()
        self._order_devices(node_ids, self._probe_partitions(node_ids))
        self.fleet = load_fleet(self.config.fleet).assign(
            node_ids,
            how=cast(Assignment, self.config.fleet_assignment),
            seed=self.config.seed,
            key=self.device_of.__getitem__,
        )
        self.clock = self._clock_override or (
            VirtualClock(self.fleet, seed=self.config.seed, key=self.device_of.__getitem__)
            if self.config.clock == "virtual"
            else WallClock()
        )
        self.scheduler = TaskScheduler(
            node_ids, concurrency=self.policy.concurrency, max_retries=self.config.max_retries
        )
        self.recorder.events.write(
            "async_start",
            strategy=self.policy.name,
            nodes=len(node_ids),
            concurrency=self.policy.concurrency,
            buffer_size=self.policy.buffer_size,
            staleness=self.policy.staleness.spec(),
            clock=self.clock.name,
            fleet=self.fleet.spec.name,
            profiles=[self.fleet.profile_for(n).name for n in self._by_device(node_ids)],
            node_of_device=self._by_device(node_ids),
            version=self.version,
        )
        log(
            INFO,
            "[fedsync] %s: %d nodes, C=%d, K=%d, %s clock, fleet %s",
            self.policy.name,
            len(node_ids),
            self.policy.concurrency,
            self.policy.buffer_size,
            self.clock.name,
            self.fleet.spec.name,
        )
        for node_id in self._by_device(node_ids):
            self.clock.wake(node_id)
        self._evaluate()
        self.stop_reason = self._loop()
        if self._last_eval_version != self.version:
            self._evaluate()
        return self._finish()

    def _loop(self) -> str:
        while True:
            reason = self._stop_reason()
            if reason:
                return reason
            self._dispatch_ready()
            event = self.clock.pop()
            if event is not None:
                limit = self.config.max_sim_time
                if limit and event.time + self._time_offset > limit:
                    # Popping moved the clock past the limit; the run ends at the limit.
                    self._time_cap = limit - self._time_offset
                    return "max-sim-time"
                self._handle(event)
                continue
            if self.clock.waiting == 0 and self.clock.queued == 0:
                # Nothing in flight and nothing scheduled: nobody can ever reply.
                if self.scheduler.exhausted:
                    return "no-devices-left"
                return "max-tasks" if self._task_counter >= self._max_tasks else "idle"
            if not self._poll():
                self._expire_overdue()
                self._refresh_nodes()
                self._sleep(self.config.poll_interval)

    def _stop_reason(self) -> str:
        config = self.config
        if self.version >= config.max_aggregations:
            return "max-aggregations"
        if config.stop_at_target and self.tally.target is not None:
            return "target-accuracy"
        if config.max_sim_time and self.clock.now() + self._time_offset >= config.max_sim_time:
            return "max-sim-time"
        if config.max_wall_time and time.monotonic() - self._wall_start >= config.max_wall_time:
            return "max-wall-time"
        return ""

    # --- dispatch -----------------------------------------------------------------------------
    def _dispatch_ready(self) -> None:
        while self._task_counter < self._max_tasks:
            node_id = self.scheduler.next_device()
            if node_id is None:
                return
            self._dispatch(node_id)

    def _dispatch(self, node_id: int) -> None:
        self._task_counter += 1
        number = self._task_counter
        task_id = f"task-{number:06d}"
        version = self.version
        uplink_spec = self.schedule.spec(version)
        downlink = self.downlink.prepare(node_id, self.trained, version)
        now = self.clock.now()
        task = _Task(task_id, node_id, version, uplink_spec, len(downlink.payload), now)
        self.tasks[task_id] = task
        self.tally.tasks += 1
        self.tally.bytes_down += len(downlink.payload)
        send = self.clock.start(task_id, node_id, len(downlink.payload))
        self.recorder.events.write(
            "dispatch",
            task=task_id,
            node=node_id,
            device=self.device_of[node_id],
            version=version,
            bytes_down=len(downlink.payload),
            downlink_kind=downlink.kind,
            uplink_codec=uplink_spec,
            in_flight=self.scheduler.in_flight,
            sim_time=self._sim(now),
        )
        if not send:
            return  # the clock lost it already (dropout/offline): a drop event follows
        content = RecordDict(
            {
                protocol.DOWNLINK: ArrayRecord(
                    {
                        protocol.PAYLOAD: Array(
                            np.frombuffer(downlink.payload, dtype=np.uint8).copy()
                        )
                    }
                ),
                protocol.CONFIG: self._task_config(version, number, uplink_spec, downlink.kind),
            }
        )
        message = Message(
            content,
            dst_node_id=node_id,
            message_type=MessageType.TRAIN,
            ttl=self.config.task_ttl,
            group_id=f"v{version}",
        )
        try:
            message_ids = [str(mid) for mid in self.grid.push_messages([message])]
            failure = "push-failed: push_messages returned no message id"
        except Exception as err:  # a dead SuperLink connection must not end the run
            message_ids, failure = [], f"push-failed: {type(err).__name__}: {err}"
        if not message_ids or not message_ids[0]:
            self.clock.error(task_id, failure)
            return
        task.message_id = message_ids[0]
        task.pushed_at = time.monotonic()
        self._by_message[task.message_id] = task_id

    def _task_config(
        self, version: int, number: int, uplink_spec: str, downlink_kind: str
    ) -> ConfigRecord:
        config = self.config
        values: dict[str, ConfigRecordValues] = {
            protocol.MODEL_VERSION: version,
            protocol.SERVER_ROUND: version,
            protocol.LOCAL_EPOCHS: config.local_epochs,
            protocol.LOCAL_STEPS: config.local_steps,
            protocol.LEARNING_RATE: config.learning_rate,
            protocol.MOMENTUM: config.momentum,
            protocol.BATCH_SIZE: config.batch_size,
            protocol.PROXIMAL_MU: config.proximal_mu,
            protocol.UPLINK_CODEC: uplink_spec,
            protocol.DOWNLINK_KIND: downlink_kind,
            protocol.TASK_SEED: _task_seed(config.seed, number),
            JOB_KEY: self.job_id,
        }
        return ConfigRecord(values)

    # --- collecting replies -------------------------------------------------------------------
    def _poll(self) -> bool:
        """Pull replies for every outstanding message; True if any came in."""
        if not self._by_message:
            return False
        replies = list(self.grid.pull_messages(list(self._by_message)))
        got = False
        for reply in replies:
            task_id = self._by_message.pop(reply.metadata.reply_to_message_id, None)
            if task_id is None:
                continue  # a reply we stopped waiting for (TTL guard) or a duplicate
            got = True
            task = self.tasks[task_id]
            if reply.has_error():
                code = int(reply.error.code)
                name = ERROR_NAMES.get(code, "error")
                self.clock.error(
                    task_id, f"{name} (code {code}): {reply.error.reason or ''}".strip()
                )
                continue
            self._read_reply(task, reply)
            self.clock.reply(task_id, self._work(task))
        return got

    def _read_reply(self, task: _Task, reply: Message) -> None:
        content = reply.content
        uplink = content.array_records.get(protocol.UPLINK)
        if uplink is None or protocol.PAYLOAD not in uplink:
            task.malformed = "reply has no uplink payload"
        else:
            array = uplink[protocol.PAYLOAD].numpy()
            if array.dtype != np.uint8 or array.ndim != 1:
                task.malformed = (
                    f"uplink payload must be 1-d uint8, got {array.dtype} {array.shape}"
                )
            else:
                task.payload = array.tobytes()
        metrics = content.metric_records.get(protocol.METRICS)
        if metrics is not None:
            task.metrics = {
                key: float(value)
                for key, value in metrics.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            }

    def _work(self, task: _Task) -> TaskWork:
        return TaskWork.from_reply(
            len(task.payload),
            examples=int(task.metrics.get(protocol.NUM_EXAMPLES, 0)),
            steps=int(task.metrics.get(protocol.NUM_STEPS, 0)),
            epochs=self.config.local_epochs,
            batch_size=self.config.batch_size,
        )

    def _expire_overdue(self) -> None:
        """Stop waiting for replies well past their TTL (Flower should have said so)."""
        now = time.monotonic()
        for message_id, task_id in list(self._by_message.items()):
            task = self.tasks[task_id]
            if now - task.pushed_at > self.config.task_ttl + _TTL_GRACE_S:
                del self._by_message[message_id]
                self.clock.error(task_id, "ttl-expired: no reply from Flower past the TTL")

    def _discover_nodes(self) -> list[int]:
        deadline = time.monotonic() + self.config.node_wait
        while True:
            node_ids = sorted(int(n) for n in self.grid.get_node_ids())
            if len(node_ids) >= self.config.min_nodes:
                return node_ids
            if time.monotonic() >= deadline:
                if node_ids:
                    log(
                        WARNING,
                        "[fedsync] only %d of %d nodes; starting",
                        len(node_ids),
                        self.config.min_nodes,
                    )
                    return node_ids
                raise RuntimeError(
                    f"no SuperNode connected within node-wait={self.config.node_wait} s"
                )
            self._sleep(1.0)

    def _probe_partitions(self, node_ids: list[int]) -> dict[int, int]:
        """Ask every node for its ``partition-id`` (see :func:`server.probe.probe_partitions`)."""
        return probe_partitions(
            self.grid,
            node_ids,
            timeout=self.config.probe_timeout,
            poll_interval=self.config.poll_interval,
            sleep=self._sleep,
        )

    def _order_devices(self, node_ids: list[int], partitions: dict[int, int]) -> None:
        """Number the devices 0..n-1: by partition id where known, then by node id."""
        order = sorted(node_ids, key=lambda n: (n not in partitions, partitions.get(n, 0), n))
        self.device_of = {node_id: index for index, node_id in enumerate(order)}

    def _by_device(self, node_ids: list[int]) -> list[int]:
        return sorted(node_ids, key=self.device_of.__getitem__)

    def _refresh_nodes(self) -> None:
        # Only deployments gain nodes mid-run; a simulation's set is fixed (and a refresh
        # there could only cost determinism).
        if self.clock.name != "wall":
            return
        now = time.monotonic()
        if now - self._last_node_refresh < _NODE_REFRESH_S:
            return
        self._last_node_refresh = now
        for node_id in sorted(int(n) for n in self.grid.get_node_ids()):
            if self.scheduler.join(node_id):
                self.device_of[node_id] = len(self.device_of)
                self.fleet.add(node_id)
                self.recorder.events.write(
                    "node-joined",
                    node=node_id,
                    device=self.device_of[node_id],
                    sim_time=self._sim_now(),
                )
                self.clock.wake(node_id)
            elif self._came_back(node_id):
                self.recorder.events.write(
                    "node-returned",
                    node=node_id,
                    device=self.device_of[node_id],
                    sim_time=self._sim_now(),
                )
                log(INFO, "[fedsync] node %d is back online; it gets work again", node_id)
                self.clock.wake(node_id)

    def _online(self, node_id: int) -> bool:
        try:
            return node_id in {int(n) for n in self.grid.get_node_ids()}
        except Exception:  # a flaky SuperLink connection: assume nothing
            return True

    def _came_back(self, node_id: int) -> bool:
        """Take back a device given up because it had left, now that it is online.

        A device given up for bad replies or crashes while online stays out. (The
        scheduler has no transition out of RETIRED; this is that transition.)
        """
        stats = self.scheduler.devices[node_id]
        if stats.state is not DeviceState.RETIRED:
            return False
        if not stats.last_failure.startswith(_GONE_FAILURES):
            return False
        stats.state = DeviceState.IDLE
        stats.consecutive_failures = 0
        return True

    # --- events -------------------------------------------------------------------------------
    def _handle(self, event: ClockEvent) -> None:
        if event.kind == "wake":
            self.scheduler.apply(event.node_id)
        elif event.kind == "reply":
            self._on_reply(event)
        elif event.kind == "error":
            self._on_error(event)
        else:
            self._on_lost(event)

    def _on_reply(self, event: ClockEvent) -> None:
        task = self.tasks.pop(event.task_id)
        node_id = task.node_id
        # The device replied, so it holds what its downlink decoded to.
        self.downlink.commit(node_id)
        staleness = self.version - task.version
        self.tally.arrivals += 1
        self.tally.bytes_up += len(task.payload)
        self.recorder.events.write(
            "arrival",
            task=task.task_id,
            node=node_id,
            device=self.device_of[node_id],
            version=task.version,
            staleness=staleness,
            bytes_up=len(task.payload),
            bytes_down=task.downlink_bytes,
            num_examples=int(task.metrics.get(protocol.NUM_EXAMPLES, 0)),
            train_loss=task.metrics.get(protocol.TRAIN_LOSS),
            sim_time=self._sim(event.time),
            sim_duration=round(event.time - task.dispatch_time, 6),
            wall_compute_s=task.metrics.get(protocol.COMPUTE_SECONDS),
        )
        update, why = self._decode(task)
        if update is None:
            self._reject(task, event, why)
            return
        norm = update_norm(update) if self.norm_guard is not None else 0.0
        if self.norm_guard is not None and (why := self.norm_guard.check(norm)):
            self._reject(task, event, why, kind="norm")
            return
        if not self.policy.accepts(staleness):
            self.tally.drops["stale"] += 1
            self.recorder.events.write(
                "drop",
                task=task.task_id,
                node=node_id,
                device=self.device_of[node_id],
                reason="stale",
                staleness=staleness,
                max_staleness=self.policy.max_staleness,
                sim_time=self._sim(event.time),
            )
            self.scheduler.finish(node_id)
            self.clock.wake(node_id)
            return
        examples = int(task.metrics.get(protocol.NUM_EXAMPLES, 0))
        weight = self.policy.weight(staleness, examples)
        self.buffer.add(update, weight)
        if self.norm_guard is not None:
            self.norm_guard.accept(norm)
        self.tally.aggregated += 1
        self.tally.staleness[staleness] += 1
        self.scheduler.finish(node_id)
        self.clock.wake(node_id)
        if self.buffer.is_full:
            self._aggregate(event.time)

    def _decode(self, task: _Task) -> tuple[SparseUpdate | None, str]:
        if task.malformed:
            return None, task.malformed
        if self.policy.weight_by_examples and task.metrics.get(protocol.NUM_EXAMPLES, 0) <= 0:
            return None, "reply lacks a positive num-examples (the weight of its update)"
        try:
            update = self._codec(task.uplink_spec).decode(task.payload, self.specs)
        except Exception as err:  # any failure to decode is the payload's fault here
            return None, f"decode failed: {type(err).__name__}: {err}"
        try:
            validate_update(update, self.specs)
        except InvalidUpdate as err:
            return None, f"invalid update: {err}"
        return dict(update), ""

    def _reject(self, task: _Task, event: ClockEvent, why: str, kind: str = "") -> None:
        self.tally.drops["rejected"] += 1
        self.rejections[kind or _rejection_kind(why)] += 1
        retired = self.scheduler.fail(task.node_id, f"rejected: {why}")
        log(WARNING, "[fedsync] rejected %s from node %d: %s", task.task_id, task.node_id, why)
        self.recorder.events.write(
            "drop",
            task=task.task_id,
            node=task.node_id,
            device=self.device_of[task.node_id],
            reason="rejected",
            rejection=kind or _rejection_kind(why),
            detail=why[:500],
            gave_up=retired,
            sim_time=self._sim(event.time),
        )
        self._after_failure(task.node_id, retired, event)

    def _on_error(self, event: ClockEvent) -> None:
        task = self.tasks.pop(event.task_id)
        # Reasons read "<kind> (code N): detail" or "<kind>: detail".
        kind = event.reason.split(":", 1)[0].split(" (", 1)[0] or "error"
        self.tally.errors[kind] += 1
        retired = self.scheduler.fail(task.node_id, event.reason)
        if not retired and kind in _GONE_FAILURES and not self._online(task.node_id):
            # The SuperLink has marked the node offline: every retry would hold a slot
            # only to fail the same way. Give it up now; _refresh_nodes takes it back
            # when it is online again.
            self.scheduler.retire(task.node_id, event.reason)
            retired = True
        self.recorder.events.write(
            "error",
            task=task.task_id,
            node=task.node_id,
            device=self.device_of[task.node_id],
            reason=event.reason[:500],
            failures=self.scheduler.devices[task.node_id].consecutive_failures,
            gave_up=retired,
            sim_time=self._sim(event.time),
        )
        self._after_failure(task.node_id, retired, event)

    def _after_failure(self, node_id: int, retired: bool, event: ClockEvent) -> None:
        self.downlink.reset(node_id)
        if retired:
            self.tally.gave_up.append(node_id)
            self.recorder.events.write(
                "give-up",
                node=node_id,
                device=self.device_of[node_id],
                failures=self.scheduler.devices[node_id].failures,
                last_failure=self.scheduler.devices[node_id].last_failure[:500],
                sim_time=self._sim(event.time),
            )
            log(WARNING, "[fedsync] node %d given up after repeated failures", node_id)
        else:
            self.clock.wake(node_id)

    def _on_lost(self, event: ClockEvent) -> None:
        task = self.tasks.pop(event.task_id)
        self.tally.drops[event.reason] += 1
        self.downlink.reset(task.node_id)
        self.scheduler.lose(task.node_id)
        self.recorder.events.write(
            "drop",
            task=task.task_id,
            node=task.node_id,
            device=self.device_of[task.node_id],
            reason=event.reason,
            sim_time=self._sim(event.time),
        )
        self.clock.wake(task.node_id)

    # --- aggregation and evaluation -----------------------------------------------------------
    def _aggregate(self, time_: float) -> None:
        aggregate = self.buffer.take()
        # The buffer may live on a GPU; the global model and optimizer state do not.
        update = {name: delta.to("cpu") for name, delta in aggregate.update.items()}
        self.optimizer.step(self.trained, update)
        self.version += 1
        self.recorder.events.write(
            "aggregation",
            version=self.version,
            updates=aggregate.count,
            weight_sum=round(aggregate.weight_sum, 9),
            sim_time=self._sim(time_),
            bytes_up=self.tally.bytes_up,
            bytes_down=self.tally.bytes_down,
        )
        if self.version % self.config.eval_every == 0:
            self._evaluate()
        if self.checkpoint_every and self.version % self.checkpoint_every == 0:
            # Right after an aggregation the buffer is empty: nothing cached is lost.
            self._save_checkpoint()

    def _evaluate(self) -> None:
        metrics = self.evaluate_fn(self.state)
        now = self._sim_now()
        wall = time.monotonic() - self._wall_start
        entry = self.tally.record_evaluation(
            self.version, dict(metrics), sim_time=now, wall_time=wall
        )
        self._last_eval_version = self.version
        self.recorder.events.write("evaluation", **entry)
        log(
            INFO,
            "[fedsync] v%d: accuracy %.4f, loss %.4f, sim %.1f s, up %d B, down %d B",
            self.version,
            entry["accuracy"],
            entry["loss"],
            now,
            self.tally.bytes_up,
            self.tally.bytes_down,
        )
        if not self.checkpoint_every:
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        if self.checkpoint_fn is None:
            return
        checkpoint = self._checkpoint()
        try:
            self.checkpoint_fn(checkpoint)
        except Exception as err:  # a full disk must not end a long run; say so loudly
            log(WARNING, "[fedsync] checkpoint at v%d failed: %s", self.version, err)
            self.recorder.events.write(
                "checkpoint-failed", version=self.version, error=f"{type(err).__name__}: {err}"
            )
            return
        self._last_checkpoint_version = self.version
        self.recorder.events.write(
            "checkpoint", version=self.version, tasks=self._task_counter, sim_time=self._sim_now()
        )

    def _checkpoint(self) -> AsyncCheckpoint:
        earlier = self.resumed.evaluations if self.resumed is not None else []
        return AsyncCheckpoint(
            self.version,
            {k: v.clone() for k, v in self.state.items()},
            self.optimizer.state_dict(),
            self._sim_now(),
            self.tally.bytes_up,
            self.tally.bytes_down,
            tasks_dispatched=self._task_counter,
            tally=tally_state(self.tally),
            evaluations=[dict(e) for e in (*earlier, *self.tally.evaluations)],
            job_id=self.job_id,
            wall_time=self._wall_before + time.monotonic() - self._wall_start,
            meta={
                "strategy": self.policy.name,
                "config": self.config.as_run_config(),
                "buffered_updates": len(self.buffer),
            },
        )

    # --- the end ------------------------------------------------------------------------------
    def _finish(self) -> AsyncResult:
        if self.checkpoint_every and self._last_checkpoint_version != self.version:
            # The end state, for extending a finished run (resume with more aggregations);
            # its cached updates are counted as discarded below, as they are.
            self._save_checkpoint()
        discarded = len(self.buffer)
        self.buffer.clear()
        summary: dict[str, Any] = {
            "strategy": self.policy.name,
            "stop_reason": self.stop_reason,
            "aggregations": self.version,
            "sim_time": round(self._sim_now(), 6),
            "wall_time": round(time.monotonic() - self._wall_start, 3),
            **self.tally.summary(),
            "updates_discarded_at_end": discarded,
            "tasks_in_flight_at_end": len(self.tasks),
            "rejections": dict(sorted(self.rejections.items())),
            "update_guard": self.norm_guard.summary() if self.norm_guard is not None else None,
            "job": self.job_id,
            "resumed_from": (
                {
                    "version": self.resumed.version,
                    "wall_time_before": round(self._wall_before, 3),
                    "evaluations_before": self.resumed.evaluations,
                }
                if self.resumed is not None
                else None
            ),
            "clock": self.clock.describe(),
            "fleet": self.fleet.spec.name,
            "policy": {
                "concurrency": self.policy.concurrency,
                "buffer_size": self.policy.buffer_size,
                "staleness": self.policy.staleness.spec(),
                "max_staleness": self.policy.max_staleness,
                "mixing": self.policy.mixing,
                "normalization": self.policy.normalization,
                "weight_by_examples": self.policy.weight_by_examples,
            },
            "server_optimizer": repr(self.optimizer),
            "devices": self.scheduler.summary(),
            "config": self.config.as_run_config(),
            "evaluations": self.tally.evaluations,
        }
        self.recorder.events.write(
            "async_end",
            reason=self.stop_reason,
            version=self.version,
            sim_time=summary["sim_time"],
            bytes_up=self.tally.bytes_up,
            bytes_down=self.tally.bytes_down,
        )
        self.recorder.write_summary(summary)
        if self.config.plots:
            self._plots()
        log(
            INFO, "[fedsync] %s ended (%s) at v%d", self.policy.name, self.stop_reason, self.version
        )
        return AsyncResult(
            global_state=self.state,
            version=self.version,
            optimizer_state=self.optimizer.state_dict(),
            summary=summary,
            evaluations=self.tally.evaluations,
        )

    def _plots(self) -> None:
        plot_run(
            self.tally.evaluations,
            self.recorder.folder,
            self.policy.name,
            target=self.config.target_accuracy or None,
            time_label=f"{'simulated' if self.clock.name == 'virtual' else 'wall'} time (s)",
        )

    # --- helpers ------------------------------------------------------------------------------
    def _codec(self, spec: str) -> UpdateCodecLike:
        codec = self._codecs.get(spec)
        if codec is None:
            try:
                codec = self._codec_factory(spec)
            except ValueError as err:
                raise AsyncConfigError(f"codec spec {spec!r} is not valid: {err}") from err
            self._codecs[spec] = codec
        return codec

    def _downlink_codec(self, spec: str) -> UpdateCodecLike:
        codec = self._codec(spec)
        # One server codec encodes for every device: an error-feedback memory inside it
        # would mix all devices' residuals. downlink-kind = "delta" keeps a residual per
        # device instead (global minus that device's replica).
        if getattr(getattr(codec, "config", None), "feedback", None) is not None:
            raise AsyncConfigError(
                f"downlink codec {spec!r} must not use error feedback (+ef): use "
                "downlink-kind = 'delta', which keeps a per-device residual on the server"
            )
        return codec

    def _sim_now(self) -> float:
        return self._sim(min(self.clock.now(), self._time_cap))

    def _sim(self, time_: float) -> float:
        return round(time_ + self._time_offset, 6)


def _rejection_kind(why: str) -> str:
    """A short class for a rejection reason: ``decode:<Error>``, ``invalid``, ..."""
    if why.startswith("decode failed: "):
        return "decode:" + why.removeprefix("decode failed: ").split(":", 1)[0]
    if why.startswith("invalid update"):
        return "invalid"
    return "malformed"


def _task_seed(seed: int, number: int) -> int:
    # Distinct, reproducible per (run seed, task number); 31 bits for torch/numpy seeds.
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, number]).generate_state(1)[0]
    return int(state) & 0x7FFFFFFF
