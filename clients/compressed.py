"""Compressed train tasks: decode the downlink, train, send an error-fed-back update.

The server's side of the downlink is :class:`fedsync.aggregation.downlink.DownlinkEncoder`:
a ``full`` payload decodes to the whole model; a ``delta`` payload decodes to the
difference against the model this node decoded last time, which the node keeps in
Flower's ``context.state``. A delta that arrives without that base (the node restarted,
so its state is gone) is refused with a clear error: the server then resets its replica
and sends a full model next time, instead of this node training from a wrong one.

The uplink is ``local model - start model``, compressed with the task's codec spec (its
density and bit width may change from task to task); the codec's sender memory (error
feedback residual, step counter) lives in ``context.state`` too, so the update mass a
task did not send goes out with a later one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from clients.runtime import ClientRuntime, LocalTraining
from fedsync import protocol
from fedsync.codec import UpdateCodec, array_to_payload, payload_to_array
from fedsync.records import get_str
from fedsync.task import model_state, tensor_specs
from fedsync.updates import TensorSpec, densify

CODEC_STATE = "fedsync-codec-state"
"""``context.state`` record: the uplink codec's sender memory (residuals, step)."""
DOWNLINK_BASE = "fedsync-downlink-base"
"""``context.state`` record: the model this node decoded from its last downlink."""


class MissingDownlinkBase(ValueError):
    """A delta downlink arrived, but this node holds no model to apply it to."""


def train_compressed(msg: Message, context: Context, runtime: ClientRuntime) -> Message:
    """Handle a compressed train task end to end and build the reply."""
    config = msg.content.config_records[protocol.CONFIG]
    model = runtime.fresh_model()
    template = model_state(model)
    specs = tensor_specs(template)

    payload = array_to_payload(
        msg.content.array_records[protocol.DOWNLINK][protocol.PAYLOAD].numpy()
    )
    start = _apply_downlink(
        payload, get_str(config, protocol.DOWNLINK_KIND, "full"), specs, context
    )
    model.load_state_dict(start, strict=False)
    model.to(runtime.device)

    train_set, _ = runtime.data()
    started = time.perf_counter()
    result = LocalTraining.from_task(config, runtime).run(model, train_set, runtime.device)
    compute_seconds = time.perf_counter() - started

    trained = model_state(model)
    delta = {name: trained[name].float() - start[name].float() for name in specs}
    codec = UpdateCodec(
        get_str(config, protocol.UPLINK_CODEC),
        seed=runtime.settings.seed * 100_003 + runtime.partition_id,
    )
    _load_codec_state(codec, context)
    uplink = codec.encode(delta)
    _save_codec_state(codec, context)

    metrics = MetricRecord(
        {
            protocol.NUM_EXAMPLES: int(result["num_examples"]),
            protocol.TRAIN_LOSS: float(result["train_loss"]),
            protocol.NUM_STEPS: int(result["steps"]),
            protocol.COMPUTE_SECONDS: compute_seconds,
            protocol.UPLINK_BYTES: len(uplink),
        }
    )
    content = RecordDict(
        {
            protocol.UPLINK: ArrayRecord({protocol.PAYLOAD: Array(payload_to_array(uplink))}),
            protocol.METRICS: metrics,
        }
    )
    return Message(content=content, reply_to=msg)


def _apply_downlink(
    payload: bytes, kind: str, specs: Mapping[str, TensorSpec], context: Context
) -> dict[str, torch.Tensor]:
    """Decode the downlink into the model to start from, and remember it."""
    decoded = densify(UpdateCodec().decode(payload, expected=specs))
    if kind == "full":
        start = decoded
    elif kind == "delta":
        base_record = context.state.array_records.get(DOWNLINK_BASE)
        if base_record is None or set(base_record.keys()) != set(decoded):
            raise MissingDownlinkBase(
                "delta downlink but this node holds no base model (restarted?); "
                "the server must send a full model"
            )
        start = {
            name: torch.from_numpy(base_record[name].numpy()) + decoded[name] for name in decoded
        }
    else:
        raise ValueError(f"downlink-kind must be 'full' or 'delta', got {kind!r}")
    context.state.array_records[DOWNLINK_BASE] = ArrayRecord(
        {name: Array(tensor.numpy()) for name, tensor in start.items()}
    )
    return start


def _load_codec_state(codec: UpdateCodec, context: Context) -> None:
    record = context.state.array_records.get(CODEC_STATE)
    if record is not None:
        codec.load_state({key: record[key].numpy() for key in record})


def _save_codec_state(codec: UpdateCodec, context: Context) -> None:
    state: dict[str, np.ndarray] = codec.to_state()
    context.state.array_records[CODEC_STATE] = ArrayRecord(
        {key: Array(value) for key, value in state.items()}
    )
