"""Pruned subnetworks: magnitude masks, the bitmap mask frame, and the engine's cut.

The engine runs with the real codec both ways: a "device" decodes its downlink with
the masks the task delivered and encodes its update with them, as the ClientApp does.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.codecs import UpdateCodec
from fedsync.compression.pruning import magnitude_masks, mask_digest, masked_spec
from fedsync.config import RunConfig, SettingsError
from fedsync.engine import AggregationEngine, InFlight
from fedsync.updates import TensorSpec
from fedsync.wire import (
    BadMagic,
    ChecksumMismatch,
    CountMismatch,
    MalformedField,
    PayloadError,
    SchemaMismatch,
    TrailingBytes,
    TruncatedPayload,
    decode_frame,
    encode_frame,
    inspect_frame,
)
from fedsync.wire.buffer import encode_varint
from fedsync.wire.layout import MAGIC
from fedsync.wire.mask import decode_masks, encode_masks

SHAPES = {"conv.weight": (8, 3, 3, 3), "conv.bias": (8,), "fc.weight": (10, 50)}
SPECS = {name: TensorSpec(name, shape) for name, shape in SHAPES.items()}


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


# --- magnitude masks --------------------------------------------------------------------------
def test_magnitude_masks_keep_the_largest_entries_of_each_weight_tensor() -> None:
    state = model()
    masks = magnitude_masks(state, 0.8)
    assert sorted(masks) == ["conv.weight", "fc.weight"]  # the bias stays whole
    for name, mask in masks.items():
        tensor = state[name]
        assert mask.shape == tensor.shape and mask.dtype == torch.bool
        assert int(mask.sum()) == round(0.2 * tensor.numel())
        # every kept entry is at least as large as every pruned one
        assert tensor[mask].abs().min() >= tensor[~mask].abs().max()
    assert mask_digest(masks) == mask_digest(magnitude_masks(state, 0.8))  # deterministic


def test_magnitude_masks_keep_at_least_one_entry_and_reject_bad_sparsity() -> None:
    masks = magnitude_masks({"w": torch.randn(2, 2)}, 0.99)
    assert int(masks["w"].sum()) == 1
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="sparsity"):
            magnitude_masks({"w": torch.randn(2, 2)}, bad)


def test_masked_spec_swaps_the_sparsifier_and_keeps_quantizer_and_feedback() -> None:
    digest = "0123456789abcdef"
    assert masked_spec("topk:0.1+uniform:8+ef", digest) == f"mask:digest={digest}+uniform:8+ef"
    assert masked_spec("none+fp16", digest) == f"mask:digest={digest}+fp16"


# --- the mask frame ---------------------------------------------------------------------------
def test_mask_frame_round_trips_as_bitmaps() -> None:
    masks = magnitude_masks(model(), 0.9)
    payload = encode_masks(masks, SPECS, version=3)
    decoded = decode_masks(payload, SPECS)
    assert decoded.version == 3
    assert sorted(decoded.masks) == sorted(masks)
    for name, mask in masks.items():
        assert torch.equal(decoded.masks[name], mask)
    # a bitmap per tensor: ceil(numel / 8) bytes, plus names, counts and the envelope
    bitmaps = sum((SPECS[n].numel + 7) // 8 for n in masks)
    assert bitmaps < len(payload) < bitmaps + 80


def _reframe(body: bytes) -> bytes:
    """A mask frame body with a fresh (valid) checksum: the fault is the body's."""
    return body + struct.pack("<I", zlib.crc32(body))


def _frame_with(masks: dict[str, torch.Tensor], specs: dict[str, TensorSpec]) -> bytes:
    return encode_masks(masks, specs, version=1)


def test_a_mask_of_the_wrong_length_is_rejected_naming_tensor_and_field() -> None:
    masks = magnitude_masks(model(), 0.9)
    # a sender that believes fc.weight has 10 x 40 entries
    other_specs = {**SPECS, "fc.weight": TensorSpec("fc.weight", (10, 40))}
    masks["fc.weight"] = masks["fc.weight"][:, :40]
    body = _frame_with(masks, other_specs)[:-4]
    # keep the receiver's schema digest, so the length check is the one that fires
    good = _frame_with(magnitude_masks(model(), 0.9), SPECS)[:-4]
    forged = _reframe(good[: 5 + 1] + good[6 : 6 + 8] + body[6 + 8 :])
    with pytest.raises(CountMismatch) as err:
        decode_masks(forged, SPECS)
    assert err.value.field == "numel" and "fc.weight" in str(err.value.tensor)
    assert err.value.expected == 500 and err.value.got == 400


def test_masks_for_another_model_are_rejected() -> None:
    masks = magnitude_masks(model(), 0.9)
    other = {**SPECS, "extra.weight": TensorSpec("extra.weight", (2, 2))}
    with pytest.raises(SchemaMismatch) as err:
        decode_masks(encode_masks(masks, other, version=1), SPECS)
    assert err.value.field == "schema"


@pytest.mark.parametrize(
    ("damage", "error", "field"),
    [
        # an update frame's magic where the mask frame's belongs
        (lambda p: MAGIC + p[len(MAGIC) :], BadMagic, "magic"),
        (lambda p: p[:-1] + bytes([p[-1] ^ 1]), ChecksumMismatch, "crc32"),
        (lambda p: _reframe(p[:-9]), TruncatedPayload, "bitmap"),
        (lambda p: _reframe(p[:-4] + b"\x00"), TrailingBytes, "mask frame"),
    ],
)
def test_damaged_mask_frames_are_typed_errors(damage: Any, error: type, field: str) -> None:
    payload = encode_masks(magnitude_masks(model(), 0.9), SPECS, version=1)
    with pytest.raises(error) as err:
        decode_masks(damage(payload), SPECS)
    assert err.value.field == field  # type: ignore[attr-defined]


def test_a_bitmap_that_disagrees_with_its_count_is_rejected() -> None:
    masks = magnitude_masks(model(), 0.9)
    body = bytearray(encode_masks(masks, SPECS, version=1)[:-4])
    # flip one bit of the last tensor's bitmap (fc.weight, 500 bits: byte 10 is inside)
    body[-10] ^= 0x01
    with pytest.raises(CountMismatch) as err:
        decode_masks(_reframe(bytes(body)), SPECS)
    assert err.value.field == "bitmap" and "fc.weight" in str(err.value.tensor)
    # a set padding bit (500 bits leave 4 padding bits in the last byte)
    body = bytearray(encode_masks(masks, SPECS, version=1)[:-4])
    body[-1] |= 0x80
    with pytest.raises(MalformedField) as bad:
        decode_masks(_reframe(bytes(body)), SPECS)
    assert bad.value.field == "bitmap"


# --- the engine's cut -------------------------------------------------------------------------
def engine_for(**values: Any) -> AggregationEngine:
    settings: dict[str, Any] = {
        "strategy": "fedbuff",
        "staleness": "constant",
        "uplink_codec": "topk:0.5+uniform:8+ef",
        "downlink_codec": "none+fp32",
        "downlink_kind": "delta",
        "downlink_delta_codec": "none+fp32",
        "buffer_size": 1,
        "prune_at_version": 1,
        "prune_sparsity": 0.8,
        **values,
    }
    return AggregationEngine(RunConfig.of(**settings), model())


class Device:
    """Holds the masks a task delivered and answers as the ClientApp does."""

    def __init__(self) -> None:
        self.masks: dict[str, torch.Tensor] | None = None
        self.model: dict[str, torch.Tensor] = {}

    def reply(self, plan: InFlight, scale: float = 0.1) -> bytes:
        if plan.mask:
            self.masks = decode_masks(plan.mask, SPECS).masks
        masks = self.masks if plan.uplink_spec.startswith("mask:") else None
        decoded = UpdateCodec(masks=masks).decode(plan.downlink.payload, SPECS)
        dense = {name: t.to_dense() for name, t in decoded.items()}
        if plan.downlink.kind == "delta":
            dense = {name: self.model[name] + dense[name] for name in dense}
        self.model = dense
        delta = {name: torch.full(shape, scale) for name, shape in SHAPES.items()}
        for name, mask in (masks or {}).items():
            delta[name] = delta[name] * mask
        return UpdateCodec(plan.uplink_spec, masks=masks, specs=SPECS).encode(delta)


def step(engine: AggregationEngine, device: Device, node: int, number: int) -> InFlight:
    plan = engine.plan_task(node, number)
    payload = device.reply(plan)
    engine.arrived(plan, len(payload))
    verdict = engine.receive(plan, payload, 10)
    assert verdict.status == "aggregated", verdict.why
    return plan


def test_the_engine_cuts_at_the_version_and_sends_the_mask_once() -> None:
    engine = engine_for(server_optimizer="momentum", server_momentum=0.9)
    device = Device()
    before = step(engine, device, node=1, number=1)
    assert before.mask == b"" and before.uplink_spec.startswith("topk:")
    assert engine.pruned is not None and engine.version == 1
    masks = engine.pruned.masks
    for name, mask in masks.items():
        assert int((engine.trained[name] != 0).sum()) == int(mask.sum())
        assert int(mask.sum()) == round(0.2 * mask.numel())

    first = step(engine, device, node=1, number=2)
    assert first.mask == engine.pruned.payload  # delivered with the next task
    assert first.downlink.kind == "full"  # no delta against a replica from before the cut
    assert first.uplink_spec == f"mask:digest={engine.pruned.digest}+uniform:8+ef"
    assert device.model["fc.weight"][~masks["fc.weight"]].abs().max() == 0
    later = [step(engine, device, node=1, number=n) for n in range(3, 6)]
    assert all(p.mask == b"" for p in later)  # once
    assert [p.downlink.kind for p in later] == ["delta"] * 3
    # the server's momentum from before the cut never revives a pruned weight
    for name, mask in masks.items():
        assert engine.trained[name][~mask].abs().max() == 0
        assert engine.trained[name][mask].abs().min() > 0
    # updates after the cut: values at the kept positions, no positions
    _, layouts = inspect_frame(device.reply(engine.plan_task(1, 6)), expected=SPECS)
    for layout in layouts:
        name = layout.spec.name
        assert layout.index_mode == ("mask" if name in masks else "dense")
        assert layout.index_nbytes == 0
        assert layout.count == (int(masks[name].sum()) if name in masks else layout.spec.numel)
    assert engine.describe()["pruning"]["masks_sent"] == 1


def test_a_failed_task_makes_the_next_one_carry_the_mask_again() -> None:
    engine = engine_for(prune_at_version=0)
    assert engine.pruned is not None  # cut at start
    plan = engine.plan_task(1, 1)
    assert plan.mask
    engine.forget(plan)  # the device failed: it may have restarted
    again = engine.plan_task(1, 2)
    assert again.mask == plan.mask
    engine.arrived(again, 1)
    assert engine.plan_task(1, 3).mask == b""
    assert engine.plan_task(2, 4).mask  # another device still needs it


def test_a_resumed_run_after_the_cut_finds_the_same_masks() -> None:
    engine = engine_for(prune_at_version=0)
    assert engine.pruned is not None
    resumed = AggregationEngine(engine.config, engine.state, version=5)
    assert resumed.pruned is not None and resumed.pruned.digest == engine.pruned.digest


def test_a_resumed_run_keeps_the_saved_cut_even_where_a_recut_would_differ() -> None:
    engine = engine_for(prune_at_version=0)
    assert engine.pruned is not None
    engine.plan_task(1, 1)  # one mask frame out
    saved = engine.pruned.checkpoint_state()
    state = {k: v.clone() for k, v in engine.state.items()}
    name = next(iter(engine.pruned.masks))
    kept = engine.pruned.masks[name]
    state[name][kept] = 0.0  # every kept weight of one tensor exactly zero: a re-cut ties
    resumed = AggregationEngine(engine.config, state, version=7, pruning_state=saved)
    assert resumed.pruned is not None
    assert resumed.pruned.digest == engine.pruned.digest
    assert resumed.pruned.version == 0 and resumed.pruned.sent == 1
    assert all(torch.equal(resumed.pruned.masks[n], m) for n, m in engine.pruned.masks.items())
    assert resumed.plan_task(1, 2).mask == engine.pruned.payload  # who held it: not saved
    # the saved form survives a checkpoint file (weights-only load)
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    again = AggregationEngine(engine.config, state, version=7, pruning_state=loaded)
    assert again.pruned is not None and again.pruned.digest == engine.pruned.digest


def _pruned_engine() -> tuple[AggregationEngine, Device, InFlight]:
    engine = engine_for(prune_at_version=0)
    device = Device()
    plan = engine.plan_task(1, 1)
    device.reply(plan)
    engine.arrived(plan, 1)
    return engine, device, plan


def test_an_update_with_the_wrong_count_for_the_mask_is_rejected() -> None:
    engine, device, plan = _pruned_engine()
    before = {name: t.clone() for name, t in engine.trained.items()}
    assert device.masks is not None
    verdict = engine.receive(plan, _count_forged(plan, device.masks, extra=1), 10)
    assert verdict.status == "rejected" and verdict.kind == "decode:CodecMismatch"
    assert "value count" in verdict.why and "fc.weight" in verdict.why
    assert engine.rejections["decode:CodecMismatch"] == 1
    assert all(torch.equal(engine.trained[n], before[n]) for n in before)


def _count_forged(plan: InFlight, masks: dict[str, torch.Tensor], extra: int) -> bytes:
    """An honest masked frame, re-framed with ``extra`` more values for fc.weight."""
    honest = UpdateCodec(plan.uplink_spec, masks=masks, specs=SPECS).encode(
        {name: torch.full(shape, 0.1) for name, shape in SHAPES.items()}
    )
    codec, tensors = decode_frame(honest, expected=SPECS)
    for tensor in tensors:
        if tensor.spec.name == "fc.weight":
            codes = tensor.values.codes
            tensor.values = replace(tensor.values, codes=np.concatenate([codes, codes[:extra]]))
    return encode_frame(codec, tensors, schema="digest")


def test_an_update_for_other_masks_is_rejected_and_the_model_untouched() -> None:
    engine, _, plan = _pruned_engine()
    before = {name: t.clone() for name, t in engine.trained.items()}
    other = magnitude_masks(model(seed=9), 0.8)
    payload = UpdateCodec("mask+uniform:8+ef", masks=other, specs=SPECS).encode(
        {name: torch.full(shape, 0.1) for name, shape in SHAPES.items()}
    )
    verdict = engine.receive(plan, payload, 10)
    # The frame names other masks, so another codec than the task's: refused on its header.
    assert verdict.status == "rejected" and verdict.kind == "codec-mismatch"
    assert mask_digest(other) in verdict.why
    assert all(torch.equal(engine.trained[n], before[n]) for n in before)


def test_prune_settings_are_checked_at_start() -> None:
    with pytest.raises(SettingsError, match="prune-sparsity"):
        RunConfig.of(prune_sparsity=1.0)
    with pytest.raises(SettingsError, match="prune-at-version"):
        RunConfig.of(prune_at_version=-2)


# --- the mask frame under fuzzing: bad bytes raise PayloadError, and only that ----------------
def _mask_frame() -> bytes:
    return encode_masks(magnitude_masks(model(), 0.9), SPECS, version=7)


def _decode_or_payload_error(payload: bytes) -> None:
    try:
        decoded = decode_masks(payload, SPECS)
    except PayloadError:
        return
    for name, mask in decoded.masks.items():  # what passes is a mask of the tensor's shape
        assert mask.shape == SPECS[name].shape and mask.dtype == torch.bool


@settings(max_examples=600, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    sealed=st.booleans(),
)
def test_edited_mask_frames_raise_only_payload_error(
    edits: list[tuple[int, int]], sealed: bool
) -> None:
    body = bytearray(_mask_frame()[:-4])
    for index, value in edits:
        body[index % len(body)] = value
    payload = _reframe(bytes(body)) if sealed else bytes(body) + _mask_frame()[-4:]
    _decode_or_payload_error(payload)


def test_every_truncation_of_a_mask_frame_is_a_payload_error() -> None:
    frame = _mask_frame()
    for end in range(len(frame)):
        with pytest.raises(PayloadError):
            decode_masks(frame[:end], SPECS)
        if end < len(frame) - 4:  # resealed: the checksum holds, the body is short
            with pytest.raises(PayloadError):
                decode_masks(_reframe(frame[:end]), SPECS)


def test_a_huge_declared_length_fails_before_reading_a_bitmap() -> None:
    good = _mask_frame()[:-4]
    count_at = 4 + 1 + 1 + 8  # magic, version, model version, schema digest
    name = b"\x0bconv.weight"
    assert good[count_at + 1 : count_at + 1 + len(name)] == name
    huge = encode_varint(2**62)
    body = good[: count_at + 1 + len(name)] + huge + good[count_at + 1 + len(name) + 2 :]
    with pytest.raises(CountMismatch) as err:
        decode_masks(_reframe(body), SPECS)
    assert err.value.field == "numel" and err.value.got == 2**62
