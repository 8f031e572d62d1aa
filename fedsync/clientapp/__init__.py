"""fedsync in your own Flower ClientApp: a task in, your training loop, an update out.

A few lines turn the ``@app.train()`` function of an ordinary Flower app into a device of
fedsync's asynchronous, compressed strategies (:mod:`fedsync.serverapp`); your model,
data and training loop stay as they are::

    from fedsync.clientapp import receive

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = Net()
        task = receive(msg, context, model)          # the model this task starts from
        loss = train_fn(model, trainloader, epochs, msg.content["config"]["lr"], device)
        return task.reply(num_examples=len(trainloader.dataset), metrics={"train_loss": loss})

:func:`receive` reads the task, decodes its downlink (the whole model, or a delta against
the model this node decoded last time, kept in ``context.state``), applies pruning masks
and AB-Training factors when the run uses them, and loads the start model into yours.
:meth:`Task.reply` compresses ``trained - start`` with the codec the task assigned, error
feedback carried in ``context.state`` across tasks, and builds the reply message with the
metrics the server reads. The same two calls also serve Flower's own dense train
messages (``FedAvg``): the arrays in, the trained arrays out. So one ClientApp serves
either strategy.

Optionally, ``app.query()(probe_reply)`` answers the server's start-of-run probe: the
server then orders devices by ``partition-id`` (repeatable runs) and reports each node's
torch device; without it, devices are ordered by node id.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedsync import protocol
from fedsync.clientapp.ab_training import FactoredModel, decode_frozen
from fedsync.clientapp.compressed import (
    Masks,
    apply_downlink,
    apply_relay_downlink,
    apply_shared_downlink,
    encode_uplink,
    hold_pruned_at_zero,
    pruning_masks,
    uplink_delta,
)
from fedsync.clientapp.node_store import INNER_OPTIMIZER, NodeStore
from fedsync.compat import in_simulation_engine
from fedsync.config import node_partition
from fedsync.models.training import InnerOptimizer
from fedsync.protocol import NodeProfile, TrainReply, TrainTask
from fedsync.recipe import model_state
from fedsync.updates import TensorSpec, tensor_specs

__all__ = ["Task", "probe_reply", "receive"]

if in_simulation_engine():
    # Flower's simulation engine loads the ClientApp, and with it this module, before it
    # starts handing out messages: from then on, one pass over its store per round
    # (fedsync.compat.flower139, section 6).
    from fedsync.compat.flower139 import index_simulation_deliveries

    index_simulation_deliveries()

MetricValue = int | float


@dataclass
class Task:
    """One train task as your ``@app.train()`` function holds it (from :func:`receive`).

    Attributes
    ----------
    message : flwr.app.Message
        The train message.
    context : flwr.app.Context
        The ClientApp's context (``context.state`` keeps the codec's memory, or with
        ``node-state = "disk"`` tokens of the files that do).
    model : torch.nn.Module
        Your model, loaded with the start model.
    module : torch.nn.Module
        What to train: ``model`` itself, or in an AB-Training run a module that trains
        one factor of each large weight matrix with the other frozen.
    config : mapping
        The task's ConfigRecord: your ``train_config`` keys and fedsync's
        (``model-version``, ``local-epochs``, ...).
    compressed : TrainTask or None
        fedsync's task (``None``: a dense Flower message, e.g. from ``FedAvg``).
    """

    message: Message
    context: Context
    model: torch.nn.Module
    module: torch.nn.Module
    config: Mapping[str, object]
    compressed: TrainTask | None = None
    _start: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _specs: dict[str, TensorSpec] = field(default_factory=dict, repr=False)
    _masks: Masks | None = field(default=None, repr=False)
    _factored: FactoredModel | None = field(default=None, repr=False)
    _hooks: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list, repr=False)
    _received_at: float = field(default_factory=time.perf_counter, repr=False)
    _store: NodeStore | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        """The global model version the task starts from (Flower's ``server-round``)."""
        if self.compressed is not None:
            return self.compressed.version
        round_ = self.config.get(protocol.SERVER_ROUND, -1)
        return round_ if isinstance(round_, int) else -1

    @property
    def schedule_step(self) -> int | None:
        """Where your learning-rate schedule stands at this task's first step: the run's
        progress in one device's steps when the task was planned (run-config
        ``client-schedule-clock = "run"``, :mod:`fedsync.aggregation.schedule_clock`), so
        a fast device of an asynchronous fleet does not decay ahead of the slow ones.
        ``None``: the task carries none (a dense Flower task, or the device clock):
        count your own steps, e.g. :attr:`~fedsync.models.training.InnerOptimizer.steps`.
        fedsync's own loop takes it as ``train(schedule_step=...)``; yours, e.g.
        ``lr * schedule.factor(task.schedule_step + k)`` at its ``k``-th step."""
        if self.compressed is None or self.compressed.schedule_step < 0:
            return None
        return self.compressed.schedule_step

    def inner_optimizer(self, *, keep_moments: bool = True) -> InnerOptimizer:
        """This device's inner optimizer as its last task left it (a fresh one at first).

        DiLoCo-style training keeps each device's local optimizer (moments, step count)
        across tasks: start yours from it with
        :meth:`~fedsync.models.training.InnerOptimizer.load_into`, keep it with
        :meth:`~fedsync.models.training.InnerOptimizer.save_from` after training, and
        pass it to :meth:`reply`. fedsync's own loop takes it as ``train(inner=...)``.
        It lives in the node's :attr:`store` (``context.state``, and with ``state-dir``
        crash-safe on disk too, so a restarted node continues it; a dense Flower task
        names no job, and its optimizer stays in ``context.state`` only). An optimizer
        of another model is left to :meth:`~fedsync.models.training.InnerOptimizer.load_into`
        to refuse. ``keep_moments=False`` keeps the step count only (a schedule across
        tasks, fresh moments each task).
        """
        arrays = self.store.get(INNER_OPTIMIZER)
        return InnerOptimizer.from_arrays(arrays, keep_moments=keep_moments)

    @property
    def store(self) -> NodeStore:
        """Everything this node keeps between tasks (run or node config ``node-state``
        and ``state-dir``: :class:`~fedsync.clientapp.node_store.NodeStore`)."""
        if self._store is None:
            self._store = NodeStore.of(self.context, job=self._job)
        return self._store

    @property
    def _task_name(self) -> str:
        """``v<version>/<task seed>``: names the task in a crash-safe file's header."""
        if self.compressed is None:
            return ""
        return f"v{self.compressed.version}/{self.compressed.task_seed}"

    @property
    def _job(self) -> str:
        """The training job the task names (a dense Flower task names none)."""
        return self.compressed.job if self.compressed is not None else ""

    def reply(
        self,
        *,
        num_examples: int,
        metrics: Mapping[str, MetricValue] | None = None,
        inner: InnerOptimizer | None = None,
    ) -> Message:
        """The reply to send back: the trained model's update (or model) and its metrics.

        Parameters
        ----------
        num_examples : int
            Training examples this device holds: TEASQ-Fed weights updates by it (and
            Flower's FedAvg too).
        metrics : mapping of str to int or float, optional
            Your own training metrics (``{"train_loss": 0.31}``); they travel in the
            reply's MetricRecord next to fedsync's (``num-examples``,
            ``compute-seconds``, ``uplink-bytes``).
        inner : InnerOptimizer, optional
            The device's inner optimizer after this task (see :meth:`inner_optimizer`):
            kept for the next one.

        Raises
        ------
        ValueError
            If ``num_examples`` is not positive, or a metric is not a number.
        """
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if isinstance(num_examples, bool) or int(num_examples) <= 0:
            raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
        values: dict[str, MetricValue] = {}
        for name, value in (metrics or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"metric {name!r} must be an int or a float, got {value!r}")
            values[name] = value
        values[protocol.NUM_EXAMPLES] = int(num_examples)
        values[protocol.COMPUTE_SECONDS] = time.perf_counter() - self._received_at
        if inner is not None:
            self.store.put(INNER_OPTIMIZER, inner.to_arrays(), task=self._task_name)
        if self.compressed is None:
            state = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
            record = MetricRecord(cast(dict[str, Any], values))
            content = RecordDict({protocol.ARRAYS: ArrayRecord(state), protocol.METRICS: record})
            return Message(content=content, reply_to=self.message)
        delta = uplink_delta(
            self.model, self._start, self._specs, factored=self._factored, masks=self._masks
        )
        uplink = encode_uplink(
            delta,
            self.compressed,
            self.context,
            partition_id=self.store.partition_id,
            masks=self._masks,
            store=self.store,
        )
        values[protocol.UPLINK_BYTES] = len(uplink)
        reply = TrainReply(uplink, {k: float(v) for k, v in values.items()})
        return Message(content=reply.to_record(), reply_to=self.message)


def receive(
    msg: Message,
    context: Context,
    model: torch.nn.Module,
    *,
    device: str | torch.device | None = None,
) -> Task:
    """Read a train task and load the model it starts from into ``model``.

    Parameters
    ----------
    msg : flwr.app.Message
        The train message (from fedsync's strategies, or Flower's dense ``arrays``).
    context : flwr.app.Context
        The ClientApp's context: ``context.state`` keeps the model this node last
        decoded (the base of a delta downlink) and the codec's error-feedback memory.
    model : torch.nn.Module
        A fresh instance of your model (any architecture; the server's model must have
        the same state-dict names and shapes). With ``downlink-kind = "shared"`` a
        node's first task may start from it as it is, once its digest is the one of the
        server's initial model.
    device : str or torch.device, optional
        Move :attr:`Task.module` there (default: leave it where it is).

    Returns
    -------
    Task
        Train :attr:`Task.module` (``model`` itself unless the run uses AB-Training),
        then send :meth:`Task.reply`.

    Raises
    ------
    fedsync.wire.PayloadError
        A downlink frame that is broken, of another codec, or of another model.
    fedsync.clientapp.compressed.MissingDownlinkBase
        A delta downlink on a node that holds no base (it restarted): the server sends
        a full model with its next task. Its subclasses too:
        :class:`~fedsync.clientapp.compressed.DownlinkVersionMismatch` (a shared frame
        for another version or base than this node holds) and
        :class:`~fedsync.clientapp.compressed.InitialModelMismatch` (the task starts
        from the seeded initial model, and ``model`` as given is not it: build it as
        the server built its ``initial_arrays``, e.g. with
        :func:`fedsync.models.initial.seeded_model`, or run the server with
        ``downlink_seeded_start=False``).
    fedsync.clientapp.compressed.PruningMaskError
        The task names pruning masks this node does not hold: the server sends them again.
    """
    content = msg.content
    config: Mapping[str, object] = content.config_records.get(protocol.CONFIG) or {}
    if not TrainTask.is_compressed(content):
        model.load_state_dict(content.array_records[protocol.ARRAYS].to_torch_state_dict())
        if device is not None:
            model.to(device)
        return Task(msg, context, model, model, config)
    task = TrainTask.from_record(content, run_id=context.run_id)
    store = NodeStore.of(context, job=task.job)
    given = model_state(model)
    specs = tensor_specs(given)
    masks = pruning_masks(task, specs, context, store)
    # The model as given, before any load: the seeded version 0 when built so.
    initial = given if task.initial_digest else None
    if task.downlink_kind == "relay":
        start = apply_relay_downlink(
            task.payload,
            specs,
            context,
            version=task.version,
            initial_digest=task.initial_digest,
            initial=initial,
            store=store,
        )
    elif task.downlink_kind == "shared":
        start = apply_shared_downlink(
            task.payload,
            specs,
            context,
            version=task.version,
            initial_digest=task.initial_digest,
            initial=initial,
            masks=masks,
            store=store,
            codecs=task.downlink_codecs,
        )
    else:
        start = apply_downlink(
            task.payload,
            task.downlink_kind,
            specs,
            context,
            keep_base=task.delta_downlinks,
            masks=masks,
            initial_digest=task.initial_digest,
            initial=initial,
            store=store,
            codecs=task.downlink_codecs,
        )
    model.load_state_dict(start, strict=False)
    factored: FactoredModel | None = None
    if task.ab_side:
        side, shapes, frozen = decode_frozen(
            task.factors, task.ab_side, specs, rank=task.ab_rank, min_rate=task.ab_min_rate
        )
        factored = FactoredModel(model, shapes, frozen, side)
    module: torch.nn.Module = factored if factored is not None else model
    if device is not None:
        module.to(device)
    return Task(
        msg,
        context,
        model,
        module,
        config,
        compressed=task,
        _start=start,
        _specs=specs,
        _masks=masks,
        _factored=factored,
        _hooks=hold_pruned_at_zero(model, masks),
        _store=store,
    )


def probe_reply(msg: Message, context: Context, *, device: str | None = None) -> Message:
    """Answer the server's start-of-run probe (register with ``app.query()(probe_reply)``).

    Reports node config ``partition-id`` / ``num-partitions`` (Flower's simulation sets
    them; none when they are missing or out of range) and ``device-class``, and the
    torch device the node trains on: ``device``, else node config ``device``.
    """
    node = context.node_config
    try:
        partition_id, num_partitions = node_partition(node)
    except ValueError:  # SettingsError, or a value that is not a number
        partition_id, num_partitions = None, 0
    profile = NodeProfile(
        partition_id=partition_id,
        num_partitions=num_partitions,
        device=device if device is not None else str(node.get(protocol.DEVICE, "")),
        device_class=str(node.get(protocol.DEVICE_CLASS, "")),
    )
    return Message(content=profile.to_record(), reply_to=msg)
