"""The names that the ServerApp and the ClientApp agree on inside a Flower Message.

Flower carries a ``RecordDict``; these constants say which records and keys a fedsync
task and its reply use, so neither side spells a string twice. The core stays free of
``flwr``: the adapters in ``clients/`` and ``server/`` build the records.

A **dense** task (the Flower FedAvg baseline) carries the model as Flower's usual
``ArrayRecord`` of float32 arrays under :data:`ARRAYS`. A **compressed** task carries
one uint8 array (an encoded frame, see :mod:`fedsync.wire`) under :data:`PAYLOAD` in
the :data:`DOWNLINK` record; its reply carries the encoded update the same way in
:data:`UPLINK`.
"""

from __future__ import annotations

from typing import Final

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

# --- reply metric keys (client -> server) ---------------------------------------------
NUM_EXAMPLES: Final = "num-examples"
TRAIN_LOSS: Final = "train-loss"
COMPUTE_SECONDS: Final = "compute-seconds"
"""Wall seconds the client spent training (real, on its hardware)."""
NUM_STEPS: Final = "num-steps"
UPLINK_BYTES: Final = "uplink-bytes"
EVAL_LOSS: Final = "eval-loss"
EVAL_ACCURACY: Final = "eval-accuracy"
