"""What the ServerApp and the ClientApp send each other: typed task and reply records.

Flower carries a ``RecordDict``; this module is the only place that builds or reads
one for fedsync's messages (:meth:`TrainTask.to_record`, :meth:`TrainTask.from_record`,
:meth:`TrainReply.to_record`, :meth:`TrainReply.from_record`), so neither side spells a
record name or key twice. It imports ``flwr`` (its record types); the engine and the
strategies do not. It imports neither torch nor :mod:`fedsync.config` (whose
:class:`~fedsync.config.RunConfig` :meth:`TrainTask.for_run` only reads), so a
process that only speaks the protocol starts without them.

The messages
------------
A **dense** task (Flower's FedAvg baseline) carries the model as Flower's usual
``ArrayRecord`` of float32 arrays under :data:`ARRAYS`; its reply is the trained model
the same way, plus :data:`METRICS`.

A **compressed** task (:class:`TrainTask`, the asynchronous strategies) carries:

* ``DOWNLINK`` ArrayRecord, ``PAYLOAD``: one uint8 array, an encoded frame. With
  ``downlink-kind = "full"`` it decodes to the whole model (floating-point tensors);
  with ``"delta"`` to a difference to add to the model this node last received (kept
  in ``context.state``); with ``"shared"`` it is a shared frame
  (:mod:`fedsync.wire.shared`: the changes since the version this node holds, or a
  whole model), or empty when the node holds its start model already. CONFIG
  ``initial-digest``, when present, says the start is the seeded initial model, which
  the node builds and checks against the digest.
* ``DOWNLINK`` ``MASK`` (a pruned run only, once per device): the pruning masks as a
  bitmap frame; the node keeps them in ``context.state``, and every later frame of
  either direction holds values at the kept positions only.
* ``DOWNLINK`` ``FACTORS`` (an AB-Training run only, every task): the frozen factor of
  each factored tensor as a frame (:mod:`fedsync.factored`); CONFIG ``ab-side`` says
  which factor the task trains, and the reply then holds that factor's delta.
* ``CONFIG`` ConfigRecord: ``model-version`` (= ``server-round``), ``local-epochs``,
  ``local-steps``, ``learning-rate``, ``momentum``, ``batch-size``, ``proximal-mu``,
  ``uplink-codec`` (the task's spec string, density and bits filled in),
  ``downlink-kind``, ``delta-downlinks`` (the node keeps the model it decoded),
  ``run-seed``, ``task-seed``, ``schedule-step`` (the run's position for the device's
  learning-rate schedule, when the run's clock sets it), AB-Training's ``ab-rank`` /
  ``ab-min-rate``, and the training job (:data:`JOB_KEY`), which nodes key their
  persisted codec state by. The application's own keys (``train_config``) travel in the
  same record (:attr:`TrainTask.extra`; :data:`TASK_KEYS` are fedsync's).

Its reply (:class:`TrainReply`) carries ``UPLINK`` ArrayRecord ``PAYLOAD`` (the encoded
delta: local model minus the start model it decoded, error feedback applied on the
client) and ``METRICS`` (``num-examples``, ``num-steps``, ``train-loss``,
``compute-seconds``, ``uplink-bytes``). A reply whose payload is missing or not a 1-d
uint8 array is read as *malformed* (:attr:`TrainReply.malformed` says why) rather than
raising: the server rejects and counts it.

Before the first task the server sends each node one QUERY (CONFIG
:data:`PROBE_KEY` ``= 1``) and expects a :class:`NodeProfile` back: METRICS
:data:`PARTITION_ID` (Flower draws node ids at random in every simulation, and the
partition id gives each device a stable index, so fleet assignment, application order
and seeded draws repeat from run to run) and a :data:`NODE` ConfigRecord with the
node's torch device and the device class it declares in its node config, which the run
summary reports next to the node's measured task times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedsync.persist import JOB_KEY
from fedsync.records import ConfigValue, get_bool, get_float, get_int, get_str

if TYPE_CHECKING:
    # Annotations only: fedsync.config imports torch and every strategy, and this
    # module must stay light (a test imports it and checks that torch is not loaded).
    from fedsync.config import RunConfig

# --- record names -------------------------------------------------------------------
ARRAYS: Final = "arrays"
"""Dense model arrays (Flower's convention, used by the FedAvg baseline)."""
CONFIG: Final = "config"
"""The task's ConfigRecord (keys below)."""
METRICS: Final = "metrics"
"""The reply's MetricRecord (keys below)."""
DOWNLINK: Final = "downlink"
"""ArrayRecord holding the encoded global model (or delta) sent to a device."""
UPLINK: Final = "uplink"
"""ArrayRecord holding the encoded model update a device sends back."""
PAYLOAD: Final = "payload"
"""The single uint8 array inside :data:`DOWNLINK` / :data:`UPLINK`."""
MASK: Final = "mask"
"""A second uint8 array of :data:`DOWNLINK` in a pruned run: the pruning-mask frame
(:mod:`fedsync.wire.mask`), sent with a device's first task after the cut (and again
after a failed or lost task)."""
FACTORS: Final = "factors"
"""A uint8 array of :data:`DOWNLINK` in an AB-Training run: the frozen factors' frame."""

# --- task config keys (server -> client) ----------------------------------------------
SERVER_ROUND: Final = "server-round"
MODEL_VERSION: Final = "model-version"
"""Global model version the task starts from (staleness is measured against it)."""
LOCAL_EPOCHS: Final = "local-epochs"
LOCAL_STEPS: Final = "local-steps"
"""Cap on optimizer steps per task (0 = no cap, epochs decide)."""
LEARNING_RATE: Final = "learning-rate"
MOMENTUM: Final = "momentum"
BATCH_SIZE: Final = "batch-size"
PROXIMAL_MU: Final = "proximal-mu"
UPLINK_CODEC: Final = "uplink-codec"
"""Codec spec string the client compresses its update with (density/bits included)."""
DOWNLINK_KIND: Final = "downlink-kind"
"""``"full"``: the payload decodes to the whole model; ``"delta"``: to a difference
against the model this device last received (kept in the client's state)."""
TASK_SEED: Final = "task-seed"
AB_SIDE: Final = "ab-side"
"""AB-Training: the factor the task trains, ``"A"`` or ``"B"`` (absent: not such a run)."""
AB_RANK: Final = "ab-rank"
"""AB-Training: the factors' rank (with :data:`AB_MIN_RATE`, which tensors are factored)."""
AB_MIN_RATE: Final = "ab-min-rate"
"""AB-Training: a tensor is factored when ``r * (m + n) * rate < m * n``."""
DELTA_DOWNLINKS: Final = "delta-downlinks"
"""Whether this run sends delta downlinks: the node then keeps the model it decoded, the
base of the next delta."""
RUN_SEED: Final = "run-seed"
"""The run's ``seed`` (a node seeds its codec's random choices with it and its partition)."""
DOWNLINK_CODECS: Final = "downlink-codecs"
"""The codec spec of each update frame in the downlink payload, in order (a list of
strings): the device decodes each with that codec only, so a frame of another codec is
a typed error (:class:`~fedsync.wire.UnexpectedCodec`), as an uplink of another codec
is on the server. Absent: the server named none (any codec decodes)."""
SCHEDULE_STEP: Final = "schedule-step"
"""Where the run stands in one device's steps when the task was planned (run-config
``client-schedule-clock = "run"``, :mod:`fedsync.aggregation.schedule_clock`): the
device's learning-rate schedule starts the task there. Absent: the device counts its own
steps."""
INITIAL_DIGEST: Final = "initial-digest"
"""A delta or shared downlink's: the digest of the seeded initial model the task starts
from (on the node's first contact); absent otherwise."""

# --- reply metric keys (client -> server) ---------------------------------------------
NUM_EXAMPLES: Final = "num-examples"
TRAIN_LOSS: Final = "train-loss"
COMPUTE_SECONDS: Final = "compute-seconds"
"""Wall seconds the client spent training (real, on its hardware)."""
NUM_STEPS: Final = "num-steps"
UPLINK_BYTES: Final = "uplink-bytes"
EVAL_LOSS: Final = "eval-loss"
EVAL_ACCURACY: Final = "eval-accuracy"

# --- the partition probe (QUERY) --------------------------------------------------------
PROBE_KEY: Final = "fedsync-probe"
"""CONFIG key of the QUERY message asking a node who it is (value 1)."""
PARTITION_ID: Final = "partition-id"
"""METRICS key of the probe's reply: the node's ``partition-id`` from its node config."""
NUM_PARTITIONS: Final = "num-partitions"
"""METRICS key of the probe's reply: the node's ``num-partitions``."""
NODE: Final = "node"
"""ConfigRecord of the probe's reply: :data:`DEVICE` and :data:`DEVICE_CLASS`."""
DEVICE: Final = "device"
"""The torch device the node trains on (node config ``device`` wins over the run's)."""
DEVICE_CLASS: Final = "device-class"
"""Node config key (and probe reply key): free text naming the node's hardware, e.g.
``jetson-orin`` or ``laptop-x86``; empty when the node declares none."""


def payload_record(payload: bytes) -> ArrayRecord:
    """One encoded frame as the single uint8 array of an ArrayRecord."""
    return ArrayRecord({PAYLOAD: Array(np.frombuffer(payload, dtype=np.uint8).copy())})


def read_payload(record: ArrayRecord | None, what: str) -> tuple[bytes, str]:
    """The frame inside a DOWNLINK/UPLINK record and ``""``, or ``b""`` and why not.

    ``what`` names the record in the reason (``"uplink"``, ``"downlink"``).
    """
    if record is None or PAYLOAD not in record:
        return b"", f"message has no {what} payload"
    array = record[PAYLOAD].numpy()
    if array.dtype != np.uint8 or array.ndim != 1:
        return b"", f"{what} payload must be 1-d uint8, got {array.dtype} {array.shape}"
    return array.tobytes(), ""


@dataclass(frozen=True)
class NodeProfile:
    """Who a node is: its reply to the partition probe.

    Attributes
    ----------
    partition_id : int or None
        The node's ``partition-id`` (``None``: it did not say).
    num_partitions : int
        The node's ``num-partitions`` (0: it did not say).
    device : str
        The torch device it trains on (``cpu``, ``cuda:0``).
    device_class : str
        The hardware class it declares in its node config (``""``: none).
    """

    partition_id: int | None
    num_partitions: int = 0
    device: str = ""
    device_class: str = ""

    def to_record(self) -> RecordDict:
        """The probe reply's content."""
        metrics = MetricRecord({NUM_PARTITIONS: self.num_partitions})
        if self.partition_id is not None:
            metrics[PARTITION_ID] = self.partition_id
        node = ConfigRecord({DEVICE: self.device, DEVICE_CLASS: self.device_class})
        return RecordDict({METRICS: metrics, NODE: node})

    @classmethod
    def from_record(cls, content: RecordDict) -> NodeProfile:
        """Read a probe reply; what is missing or of the wrong type is left empty."""
        metrics: Mapping[str, object] = content.metric_records.get(METRICS) or {}
        node: Mapping[str, object] = content.config_records.get(NODE) or {}

        def integer(value: object) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(value: object) -> str:
            return value[:200] if isinstance(value, str) else ""

        return cls(
            partition_id=integer(metrics.get(PARTITION_ID)),
            num_partitions=integer(metrics.get(NUM_PARTITIONS)) or 0,
            device=text(node.get(DEVICE)),
            device_class=text(node.get(DEVICE_CLASS)),
        )

    def describe(self) -> dict[str, str]:
        """The summary's per-device fields."""
        return {"device": self.device, "device_class": self.device_class}


@dataclass(frozen=True)
class TrainTask:
    """A compressed training task (the asynchronous strategies' TRAIN message).

    Attributes
    ----------
    payload : bytes
        The encoded downlink frame.
    downlink_kind : {"full", "delta", "shared"}
        How the payload applies (see the module docstring).
    version : int
        The global model version the task starts from.
    uplink_codec : str
        The codec spec the update goes back with.
    task_seed : int
        Seeds the task's random choices (shuffling, stochastic rounding).
    job : str
        The training job (:data:`JOB_KEY`).
    local_epochs, local_steps, batch_size : int
        Local work (``local_steps = 0``: epochs decide).
    learning_rate, momentum, proximal_mu : float
        Local optimizer settings.
    mask : bytes
        The pruning-mask frame (:mod:`fedsync.wire.mask`) when this task delivers it;
        empty otherwise.
    ab_side : {"", "A", "B"}
        AB-Training: the factor to train (``""``: train the whole model).
    factors : bytes
        AB-Training: the frozen factors' frame.
    ab_rank, ab_min_rate : int, float
        AB-Training: which tensors are factored, and at which rank.
    delta_downlinks : bool
        The run sends delta downlinks: the node keeps the model it decoded.
    run_seed : int
        The run's seed.
    initial_digest : str
        A delta or shared downlink's: the seeded initial model's digest when the task
        starts from it (``""`` otherwise).
    schedule_step : int
        The run's position for the device's learning-rate schedule (:data:`SCHEDULE_STEP`;
        ``-1``: none, the device counts its own steps).
    downlink_codecs : tuple of str
        The codec of each update frame in :attr:`payload` (:data:`DOWNLINK_CODECS`;
        empty: none named).
    extra : mapping of str to config value
        The application's own task config (``train_config`` of
        :meth:`fedsync.strategies.Strategy.start`), sent in the same CONFIG record;
        fedsync's keys above win over a key of the same name.
    """

    payload: bytes
    downlink_kind: str
    version: int
    uplink_codec: str
    task_seed: int
    job: str
    local_epochs: int
    local_steps: int
    batch_size: int
    learning_rate: float
    momentum: float
    proximal_mu: float
    mask: bytes = b""
    ab_side: str = ""
    factors: bytes = b""
    ab_rank: int = 0
    ab_min_rate: float = 0.0
    delta_downlinks: bool = False
    run_seed: int = 0
    initial_digest: str = ""
    schedule_step: int = -1
    downlink_codecs: tuple[str, ...] = ()
    extra: Mapping[str, ConfigValue] = field(default_factory=dict)

    @classmethod
    def for_run(cls, config: RunConfig, **task: Any) -> TrainTask:
        """A task of this run: its local-training settings, its seed, whether it sends
        delta downlinks and, in an AB-Training run, the factors' rank (``task``: the
        other fields; ``local_steps`` there wins over the run's, a budget of its own)."""
        training, compression = config.training, config.compression
        local_steps = task.pop("local_steps", training.local_steps)
        return cls(
            **task,
            local_epochs=training.local_epochs,
            local_steps=local_steps,
            batch_size=training.batch_size,
            learning_rate=training.learning_rate,
            momentum=training.momentum,
            proximal_mu=training.proximal_mu,
            ab_rank=compression.ab_rank,
            ab_min_rate=compression.ab_min_rate,
            delta_downlinks=compression.downlink_kind == "delta",
            run_seed=training.seed,
        )

    def to_record(self) -> RecordDict:
        """The TRAIN message's content."""
        config = ConfigRecord(
            {
                **self.extra,
                MODEL_VERSION: self.version,
                SERVER_ROUND: self.version,
                LOCAL_EPOCHS: self.local_epochs,
                LOCAL_STEPS: self.local_steps,
                LEARNING_RATE: self.learning_rate,
                MOMENTUM: self.momentum,
                BATCH_SIZE: self.batch_size,
                PROXIMAL_MU: self.proximal_mu,
                UPLINK_CODEC: self.uplink_codec,
                DOWNLINK_KIND: self.downlink_kind,
                TASK_SEED: self.task_seed,
                JOB_KEY: self.job,
                DELTA_DOWNLINKS: self.delta_downlinks,
                RUN_SEED: self.run_seed,
            }
        )
        if self.initial_digest:
            config[INITIAL_DIGEST] = self.initial_digest
        if self.schedule_step >= 0:
            config[SCHEDULE_STEP] = self.schedule_step
        if self.downlink_codecs:
            config[DOWNLINK_CODECS] = list(self.downlink_codecs)
        downlink = payload_record(self.payload)
        if self.mask:
            downlink[MASK] = Array(np.frombuffer(self.mask, dtype=np.uint8).copy())
        if self.ab_side:
            config[AB_SIDE] = self.ab_side
            config[AB_RANK] = self.ab_rank
            config[AB_MIN_RATE] = self.ab_min_rate
            downlink[FACTORS] = Array(np.frombuffer(self.factors, dtype=np.uint8).copy())
        return RecordDict({DOWNLINK: downlink, CONFIG: config})

    @classmethod
    def from_record(cls, content: RecordDict, *, run_id: int = 0) -> TrainTask:
        """Read a TRAIN message's content.

        Raises
        ------
        fedsync.records.RecordValueError
            A key is missing or of the wrong type.
        ValueError
            The downlink payload is missing or malformed.
        """
        record = content.array_records.get(DOWNLINK)
        payload, why = read_payload(record, "downlink")
        if why:
            raise ValueError(why)
        mask = _extra_frame(record, MASK)
        factors = _extra_frame(record, FACTORS)
        config = content.config_records[CONFIG]
        ab_side = get_str(config, AB_SIDE, "")
        if ab_side not in ("", "A", "B") or bool(ab_side) != bool(factors):
            raise ValueError(
                f"task config {AB_SIDE!r} = {ab_side!r} with {len(factors)} bytes of "
                "factors: an AB-Training task names side 'A' or 'B' and carries factors"
            )
        return cls(
            payload=payload,
            downlink_kind=get_str(config, DOWNLINK_KIND, "full"),
            version=get_int(config, MODEL_VERSION, -1),
            uplink_codec=get_str(config, UPLINK_CODEC),
            task_seed=get_int(config, TASK_SEED, 0),
            # The job a resumed server run continues (an older server: this run alone).
            job=get_str(config, JOB_KEY, "") or f"run-{run_id}",
            local_epochs=get_int(config, LOCAL_EPOCHS),
            local_steps=get_int(config, LOCAL_STEPS),
            batch_size=get_int(config, BATCH_SIZE),
            learning_rate=get_float(config, LEARNING_RATE),
            momentum=get_float(config, MOMENTUM),
            proximal_mu=get_float(config, PROXIMAL_MU),
            mask=mask,
            ab_side=ab_side,
            factors=factors,
            ab_rank=get_int(config, AB_RANK, 0),
            ab_min_rate=get_float(config, AB_MIN_RATE, 0.0),
            delta_downlinks=get_bool(config, DELTA_DOWNLINKS, False),
            run_seed=get_int(config, RUN_SEED, 0),
            initial_digest=get_str(config, INITIAL_DIGEST, ""),
            schedule_step=get_int(config, SCHEDULE_STEP, -1),
            downlink_codecs=_codec_list(config.get(DOWNLINK_CODECS, [])),
            extra={k: v for k, v in config.items() if k not in TASK_KEYS},  # type: ignore[misc]
        )

    @staticmethod
    def is_compressed(content: RecordDict) -> bool:
        """Whether a TRAIN message is a compressed task (else: Flower's dense one)."""
        return DOWNLINK in content


TASK_KEYS: Final = frozenset(
    {
        MODEL_VERSION,
        SERVER_ROUND,
        LOCAL_EPOCHS,
        LOCAL_STEPS,
        LEARNING_RATE,
        MOMENTUM,
        BATCH_SIZE,
        PROXIMAL_MU,
        UPLINK_CODEC,
        DOWNLINK_KIND,
        TASK_SEED,
        JOB_KEY,
        DELTA_DOWNLINKS,
        RUN_SEED,
        INITIAL_DIGEST,
        SCHEDULE_STEP,
        DOWNLINK_CODECS,
        AB_SIDE,
        AB_RANK,
        AB_MIN_RATE,
    }
)
"""fedsync's own keys of a task's CONFIG record (the rest are the application's)."""


@dataclass(frozen=True)
class TrainReply:
    """A device's reply to a :class:`TrainTask`.

    Attributes
    ----------
    payload : bytes
        The encoded update (``b""`` when :attr:`malformed`).
    metrics : dict of str to float
        The numeric METRICS (``num-examples``, ``num-steps``, ``train-loss``, ...).
    malformed : str
        Why the reply could not be read (empty: it could).
    """

    payload: bytes
    metrics: dict[str, float] = field(default_factory=dict)
    malformed: str = ""

    @property
    def num_examples(self) -> int:
        """Training examples the device holds (its weight in TEASQ-Fed)."""
        return int(self.metrics.get(NUM_EXAMPLES, 0))

    @property
    def num_steps(self) -> int:
        """Optimizer steps the task took."""
        return int(self.metrics.get(NUM_STEPS, 0))

    def to_record(self) -> RecordDict:
        """The reply message's content."""
        metrics = MetricRecord(
            {
                k: (int(v) if k in (NUM_EXAMPLES, NUM_STEPS, UPLINK_BYTES) else float(v))
                for k, v in self.metrics.items()
            }
        )
        return RecordDict({UPLINK: payload_record(self.payload), METRICS: metrics})

    @classmethod
    def from_record(cls, content: RecordDict) -> TrainReply:
        """Read a reply; a missing or malformed payload makes a *malformed* reply."""
        payload, why = read_payload(content.array_records.get(UPLINK), "uplink")
        metrics: Mapping[str, object] = content.metric_records.get(METRICS) or {}
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        return cls(payload, numbers, why)


def _codec_list(value: object) -> tuple[str, ...]:
    """A task's :data:`DOWNLINK_CODECS`, checked: a list of non-empty strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"task config {DOWNLINK_CODECS!r} must be a list of codec specs")
    return tuple(value)


def _extra_frame(record: ArrayRecord | None, name: str) -> bytes:
    """A second frame of the downlink (masks, factors): its bytes, ``b""`` when absent.

    Raises
    ------
    ValueError
        If it is there but not a 1-d uint8 array.
    """
    if record is None or name not in record:
        return b""
    array = record[name].numpy()
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError(f"downlink {name} must be 1-d uint8, got {array.dtype} {array.shape}")
    return array.tobytes()
