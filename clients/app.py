"""The fedsync ClientApp: a train task in, local training, a (compressed) update out.

The same code serves Flower's simulation engine and a deployed SuperNode: the node's
partition (``partition-id``, ``num-partitions``) and its torch device (``device``) come
from the node config, everything else from the run config. Optional node config:
``state-dir`` keeps the codec's error-feedback state on disk across SuperNode restarts
(:mod:`fedsync.clientapp.node_store`); ``fault`` / ``fault-rate`` make the node send corrupt
updates, for testing deployments only (:mod:`fedsync.clientapp.faults`); ``timing-log``
appends each message's phase times to a JSONL file (:mod:`fedsync.clients.timing`).

Two kinds of train task arrive (names in :mod:`fedsync.protocol`):

* **dense** -- Flower's convention, the model as an ``ArrayRecord`` of float32 arrays; the
  reply is the locally trained model, dense. This is the FedAvg baseline.
* **compressed** -- the model (or a delta against what this node last received) as one
  encoded frame; the reply is the encoded, error-fed-back update. See
  :mod:`fedsync.clientapp.compressed`.
"""

from __future__ import annotations

# First: it times the imports below (torch) for node config timing-log.
from fedsync.clients import timing

# isort: split
from logging import WARNING

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from fedsync import protocol
from fedsync.clientapp import probe_reply, receive
from fedsync.clients.runtime import ClientRuntime, LocalTraining
from fedsync.models.training import evaluate as evaluate_model

app = ClientApp(mods=[timing.phase_timing()])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on the local partition and reply with the new model or its update."""
    return train_task(msg, context, ClientRuntime.from_context(context))


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received dense model on the local validation split."""
    runtime = ClientRuntime.from_context(context)
    model = runtime.fresh_model()
    model.load_state_dict(msg.content.array_records[protocol.ARRAYS].to_torch_state_dict())
    _, validation = runtime.data()
    result = evaluate_model(
        model, validation, batch_size=runtime.settings.batch_size, device=runtime.device
    )
    metrics = MetricRecord(
        {
            protocol.EVAL_LOSS: float(result["loss"]),
            protocol.EVAL_ACCURACY: float(result["accuracy"]),
            protocol.NUM_EXAMPLES: int(result["num_examples"]),
        }
    )
    return Message(content=RecordDict({protocol.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server who this node is (:class:`~fedsync.protocol.NodeProfile`).

    Flower draws node ids at random in every simulation; the server orders devices,
    assigns fleet profiles and seeds its draws by ``partition-id`` instead, so runs
    repeat. The node's torch device and declared ``device-class`` go into the run's
    summary next to its measured task times.
    """
    return probe_reply(msg, context, device=str(ClientRuntime.from_context(context).device))


def train_task(msg: Message, context: Context, runtime: ClientRuntime) -> Message:
    """Handle a train task end to end: fedsync's own training loop between
    :func:`fedsync.clientapp.receive` and :meth:`~fedsync.clientapp.Task.reply`, as any
    application does. A compressed task (fedsync's strategies) takes its local-training
    settings from the task, a dense one (Flower's FedAvg) from its ConfigRecord."""
    train_set, _ = runtime.data()  # before receive: compute-seconds counts training only
    task = receive(msg, context, runtime.fresh_model(), device=runtime.device)
    training = (
        LocalTraining.from_train_task(task.compressed, runtime)
        if task.compressed is not None
        else LocalTraining.from_task(task.config, runtime)
    )
    settings = runtime.settings
    inner = None
    if settings.keeps_optimizer_state or settings.schedule is not None:
        inner = task.inner_optimizer(keep_moments=settings.keeps_optimizer_state)
        params = [p for p in task.module.parameters() if p.requires_grad]
        try:
            inner.check_fits(params)
        except ValueError as err:  # another module (AB-Training's other factor)
            log(WARNING, "[fedsync] a fresh inner optimizer for this task: %s", err)
            inner.state = None
    result = training.run(task.module, train_set, runtime.device, inner)
    if inner is not None and not settings.keeps_optimizer_state:
        inner.state = None  # "reset": only the step count (the schedule) carries over
    return task.reply(
        num_examples=int(result["num_examples"]),
        metrics={
            protocol.TRAIN_LOSS: float(result["train_loss"]),
            protocol.NUM_STEPS: int(result["steps"]),
        },
        inner=inner,
    )
