"""A node in a pruned run: it keeps the masks a task delivers, trains the subnetwork, and
sends values at the kept positions only.

The real ClientApp path runs (:func:`fedsync.clients.app.train_task`: decode the
downlink, train on digits, encode), with hand-built Flower Messages as in
``test_client_state``; a "restart" is a fresh ``Context``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flwr.app import Context, Message, MessageType, RecordDict

from fedsync import protocol
from fedsync.clientapp.compressed import PRUNING_MASK, PruningMaskError, hold_pruned_at_zero
from fedsync.clients.app import train_task
from fedsync.clients.runtime import ClientRuntime
from fedsync.codecs import UpdateCodec
from fedsync.compression.pruning import apply_masks, magnitude_masks, mask_digest, masked_spec
from fedsync.data import ArrayDataset
from fedsync.models.training import train as train_model
from fedsync.protocol import TrainTask
from fedsync.updates import TensorSpec, tensor_specs
from fedsync.wire import SchemaMismatch, inspect_frame
from fedsync.wire.mask import encode_masks
from tests.unit.test_client_state import RUN_CONFIG, _task_identity, global_model

__all__ = ["_task_identity"]  # the module-scoped fixture Message() needs

UPLINK = "topk:0.05+uniform:4+ef"


def pruned() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The digits model cut to 90 % sparsity, and its masks."""
    state = global_model()
    masks = magnitude_masks(state, 0.9)
    apply_masks(state, masks)
    return state, masks


def task(
    number: int, masks: dict[str, torch.Tensor], *, deliver: bytes = b"", digest: str = ""
) -> Message:
    state, _ = pruned()
    specs = tensor_specs(state)
    downlink = UpdateCodec(masked_spec("none+fp32", mask_digest(masks)), masks=masks, specs=specs)
    digest = digest or mask_digest(masks)
    train = TrainTask(
        payload=downlink.encode(state),
        downlink_kind="full",
        version=2,
        uplink_codec=masked_spec(UPLINK, digest),
        task_seed=1000 + number,
        job="job-1",
        local_epochs=1,
        local_steps=3,
        batch_size=32,
        learning_rate=0.1,
        momentum=0.9,
        proximal_mu=0.0,
        mask=deliver,
    )
    message = Message(train.to_record(), dst_node_id=1, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = f"task-{number}"
    return message


def context() -> Context:
    return Context(
        run_id=7,
        node_id=1,
        node_config={"partition-id": 1, "num-partitions": 3},
        state=RecordDict(),
        run_config={**RUN_CONFIG, "downlink-kind": "full"},
    )


def uplink(message: Message, ctx: Context) -> bytes:
    reply = train_task(message, ctx, ClientRuntime.from_context(ctx))
    return bytes(reply.content.array_records[protocol.UPLINK][protocol.PAYLOAD].numpy().tobytes())


def test_a_node_keeps_the_delivered_masks_and_sends_kept_values_only() -> None:
    state, masks = pruned()
    specs = tensor_specs(state)
    ctx = context()
    frame = encode_masks(masks, specs, version=2)
    first = uplink(task(1, masks, deliver=frame), ctx)
    assert PRUNING_MASK in ctx.state.array_records
    second = uplink(task(2, masks), ctx)  # no mask this time: the node holds it
    for payload in (first, second):
        codec, layouts = inspect_frame(payload, expected=specs)
        assert codec == masked_spec(UPLINK, mask_digest(masks))
        for layout in layouts:
            name = layout.spec.name
            if name in masks:
                assert layout.index_mode == "mask" and layout.index_nbytes == 0
                assert layout.count == int(masks[name].sum())
            else:
                assert layout.index_mode == "dense"
        decoded = UpdateCodec(masks=masks).decode(payload, specs)
        for name, mask in masks.items():
            kept = mask.reshape(-1).nonzero().reshape(-1)
            assert torch.equal(decoded[name].indices, kept)
    # 4-bit codes of the kept values, and no positions: far below a top-5 % frame
    dense_bytes = 4 * sum(t.numel() for t in state.values())
    assert len(second) < dense_bytes / 7


def test_a_restarted_node_refuses_a_task_that_names_masks_it_lost() -> None:
    _, masks = pruned()
    with pytest.raises(PruningMaskError, match="does not hold"):
        uplink(task(1, masks), context())


def test_masks_for_another_model_are_refused_and_the_held_ones_kept() -> None:
    state, masks = pruned()
    specs = tensor_specs(state)
    ctx = context()
    uplink(task(1, masks, deliver=encode_masks(masks, specs, version=2)), ctx)
    held = bytes(ctx.state.array_records[PRUNING_MASK]["frame"].numpy().tobytes())
    other_specs = {**specs, "extra.weight": TensorSpec("extra.weight", (2, 2))}
    with pytest.raises(SchemaMismatch):
        uplink(task(2, masks, deliver=encode_masks(masks, other_specs, version=2)), ctx)
    assert bytes(ctx.state.array_records[PRUNING_MASK]["frame"].numpy().tobytes()) == held


def test_a_task_naming_other_masks_is_refused() -> None:
    state, masks = pruned()
    ctx = context()
    frame = encode_masks(masks, tensor_specs(state), version=2)
    with pytest.raises(PruningMaskError, match="names pruning masks"):
        uplink(task(1, masks, deliver=frame, digest="0" * 16), ctx)


def test_masks_delivered_from_the_future_are_refused() -> None:
    state, masks = pruned()
    frame = encode_masks(masks, tensor_specs(state), version=3)  # the task is version 2
    with pytest.raises(PruningMaskError, match="version 3"):
        uplink(task(1, masks, deliver=frame), context())


def test_pruned_weights_stay_zero_through_local_sgd() -> None:
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    masks = magnitude_masks(state, 0.8)
    apply_masks(state, masks)
    model.load_state_dict(state)
    data = ArrayDataset(
        torch.randn(64, 8, generator=generator).numpy(),
        torch.randint(0, 3, (64,), generator=generator).numpy(),
    )
    hooks = hold_pruned_at_zero(model, masks)
    train_model(
        model,
        data,
        epochs=2,
        batch_size=8,
        lr=0.1,
        momentum=0.9,
        weight_decay=1e-3,
        proximal_mu=0.1,
    )
    for hook in hooks:
        hook.remove()
    trained: dict[str, Any] = model.state_dict()
    for name, mask in masks.items():
        assert trained[name][~mask].abs().max() == 0
        assert not torch.equal(trained[name][mask], state[name][mask])  # it did train
