"""The context-coded bitmap: round trips, when the encoder picks it, and every way a
section can lie (decoding past its end, bytes left over, counts that disagree)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels.context_coding import context_decode, context_encode
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import (
    CountMismatch,
    FrameLimits,
    LimitExceeded,
    MalformedField,
    TruncatedPayload,
    decode_frame,
    encode_frame,
    index_bits_for,
)
from fedsync.wire.index_coding import (
    CONTEXT_MAX_NUMEL,
    choose_index_coding,
    decode_indices,
    encode_indices,
    index_candidates,
)
from fedsync.wire.testing import FrameBuilder


def clustered(rng: np.random.Generator, rows: int, width: int, density: float) -> np.ndarray:
    """A support like a real top-k one: a few hot rows and hot columns (whole output
    units and input features), their crossings mostly kept, a little noise."""
    hot_rows = rng.random(rows) < 0.1
    hot_cols = rng.random(width) < 0.1
    p = np.full((rows, width), density / 5)
    p[hot_rows, :] += 2 * density
    p[:, hot_cols] += 2 * density
    p[np.ix_(hot_rows, hot_cols)] = 0.9
    return np.flatnonzero(rng.random((rows, width)) < np.clip(p, 0, 1)).astype(np.int64)


def _tensor(shape: tuple[int, ...], indices: np.ndarray) -> CompressedTensor:
    codes = np.arange(len(indices), dtype=np.uint32) % 256
    return CompressedTensor(
        TensorSpec("w", shape), "explicit", indices, QuantizedValues("uniform", 8, codes, {})
    )


def _section(indices: np.ndarray, shape: tuple[int, ...]) -> bytes:
    numel = int(np.prod(shape))
    plan = choose_index_coding(indices, numel, coding="context", shape=shape)
    return encode_indices(indices, numel, plan)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 12),
    width=st.integers(1, 40),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_any_support(rows: int, width: int, density: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    indices = np.flatnonzero(rng.random(rows * width) < density).astype(np.int64)
    out = np.zeros(2 * rows * width + 16, np.uint8)
    nbytes = context_encode(indices, rows, width, out)
    assert nbytes >= 4
    decoded = np.empty(len(indices), np.int64)
    status = context_decode(out[:nbytes].copy(), len(indices), rows, width, decoded)
    assert status[0] == 0, status
    np.testing.assert_array_equal(decoded, indices)


def test_clustered_supports_take_the_context_coding_and_save_bits() -> None:
    rng = np.random.default_rng(1)
    for shape, density in (((120, 400), 0.01), ((96, 150), 0.02), ((1024, 256), 0.01)):
        numel = int(np.prod(shape))
        indices = clustered(rng, shape[0], numel // shape[0], density)
        bits = index_bits_for(indices, numel, shape=shape)
        others = min(v for c, v in bits.items() if c != "context")
        assert bits["context"] < 0.85 * others, (shape, bits)
        payload = encode_frame("c", [_tensor(shape, indices)])
        (tensor,) = decode_frame(payload)[1]
        np.testing.assert_array_equal(tensor.indices, indices)
        assert choose_index_coding(indices, numel, shape=shape).coding == "context"


def test_random_supports_skip_the_context_coder() -> None:
    rng = np.random.default_rng(2)
    numel = 200_000
    indices = np.sort(rng.choice(numel, 2000, replace=False)).astype(np.int64)
    plans = index_candidates(indices, numel, shape=(400, 500))
    assert "context" not in {plan.coding for plan in plans}  # the O(count) test said no
    assert choose_index_coding(indices, numel, shape=(400, 500)).coding == "rice"


def test_context_needs_a_position_and_a_bounded_tensor() -> None:
    with pytest.raises(ValueError, match="cannot carry"):
        choose_index_coding(np.zeros(0, np.int64), 10, coding="context")
    big = np.array([0, CONTEXT_MAX_NUMEL], dtype=np.int64)
    with pytest.raises(ValueError, match="cannot carry"):
        choose_index_coding(big, CONTEXT_MAX_NUMEL + 1, coding="context")


# --------------------------------------------------------------------------------------
# Sections that lie: typed errors, found before anything is returned.
# --------------------------------------------------------------------------------------

SHAPE = (16, 40)
INDICES = clustered(np.random.default_rng(3), 16, 40, 0.1)


def _frame(section: bytes, count: int = len(INDICES), shape: tuple[int, ...] = SHAPE) -> bytes:
    return (
        FrameBuilder()
        .add(
            shape=shape,
            mode=0,
            count=count,
            coding=5,
            index=section,
            scheme=4,
            bits=8,
            codes=bytes(count),
        )
        .build()
    )


def _decode_section(section: bytes, count: int = len(INDICES)) -> np.ndarray:
    return decode_indices(
        np.frombuffer(section, np.uint8),
        "context",
        0,
        count,
        int(np.prod(SHAPE)),
        tensor="t",
        shape=SHAPE,
    )


def test_valid_section_through_the_builder() -> None:
    (tensor,) = decode_frame(_frame(_section(INDICES, SHAPE)))[1]
    np.testing.assert_array_equal(tensor.indices, INDICES)


def test_decoding_past_the_end_is_a_truncated_payload() -> None:
    section = _section(INDICES, SHAPE)
    for cut in range(4, len(section)):
        with pytest.raises((TruncatedPayload, CountMismatch, MalformedField)) as info:
            _decode_section(section[:cut])
        # Cutting the stream leaves the decoder wanting bytes, or (rarely, when the
        # lost bytes were implied by the flush) with a wrong count or a bad code.
        assert "index section (context)" in str(info.value)
    with pytest.raises(TruncatedPayload, match="reads past the section's end"):
        decode_frame(_frame(section[: len(section) // 2]))


def test_bytes_left_over_after_the_bitmap_are_rejected() -> None:
    section = _section(INDICES, SHAPE)
    with pytest.raises(MalformedField, match="ends before its section does"):
        decode_frame(_frame(section + b"\x00"))


def test_counts_that_disagree_with_the_bitmap() -> None:
    section = _section(INDICES, SHAPE)
    with pytest.raises(CountMismatch, match="beyond the"):
        decode_frame(_frame(section, count=len(INDICES) - 1))
    with pytest.raises(CountMismatch, match="fewer positions"):
        decode_frame(_frame(section, count=len(INDICES) + 1))


def test_a_short_or_oversized_context_section_is_rejected_before_decoding() -> None:
    with pytest.raises(MalformedField, match="shorter than the coder's start"):
        decode_frame(_frame(b"\x00\x00\x00", count=1))
    # 2**24 + 1 elements, a 4-byte section: rejected by the table check, no work done.
    with pytest.raises(MalformedField, match="CONTEXT_MAX_NUMEL"):
        decode_frame(_frame(bytes(4), count=1, shape=(CONTEXT_MAX_NUMEL + 1,)))


def test_frame_limit_on_context_coded_elements() -> None:
    payload = encode_frame("c", [_tensor(SHAPE, INDICES)], index_coding="context")
    decode_frame(payload)
    with pytest.raises(LimitExceeded, match="max_context_numel"):
        decode_frame(payload, limits=FrameLimits(max_context_numel=int(np.prod(SHAPE)) - 1))
