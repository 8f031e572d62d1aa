"""The context-coded bitmap: round trips, when the encoder picks it, and every way a
section can lie (decoding past its end, bytes left over, counts that disagree, more
elements than its bytes may cover)."""

from __future__ import annotations

import functools
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels.context_coding import context_decode, context_encode
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import (
    DEFAULT_LIMITS,
    CountMismatch,
    FrameLimits,
    LimitExceeded,
    MalformedField,
    TruncatedPayload,
    decode_frame,
    encode_frame,
    index_bits_for,
    inspect_frame,
)
from fedsync.wire.index_coding import (
    CONTEXT_MAX_NUMEL,
    choose_index_coding,
    context_min_nbytes,
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


def test_a_section_may_cover_only_so_many_elements_per_byte() -> None:
    payload = encode_frame("c", [_tensor(SHAPE, INDICES)], index_coding="context")
    (layout,) = inspect_frame(payload)[1]
    numel, nbytes = int(np.prod(SHAPE)), layout.index_nbytes
    assert numel > nbytes  # a clustered support: fewer bytes than elements
    enough = -(-numel // nbytes)  # the tightest bound the section meets
    decode_frame(payload, limits=FrameLimits(max_context_numel_per_byte=enough))
    for per_byte in (enough - 1, 0):  # one element a byte less, and none at all
        with pytest.raises(LimitExceeded, match="max_context_numel_per_byte") as info:
            decode_frame(payload, limits=FrameLimits(max_context_numel_per_byte=per_byte))
        assert info.value.field == "index bytes"
    fits, short = context_min_nbytes(numel, enough), context_min_nbytes(numel, enough - 1)
    assert fits is not None and short is not None
    assert fits <= nbytes < short
    assert context_min_nbytes(numel, 0) is None
    assert context_min_nbytes(1, 4096) == 4  # never below the coder's start


BIG = (4096, 4096)
BIG_KEPT = np.arange(0, 3600, 2, dtype=np.int64)  # 1,800 positions, all in row 0


@functools.cache
def _big_section() -> bytes:
    """A valid section for ``BIG_KEPT`` in ``BIG``: 129 bytes for 2**24 elements."""
    out = np.zeros(1 << 12, np.uint8)
    nbytes = int(context_encode(BIG_KEPT, BIG[0], BIG[1], out))
    assert 0 < nbytes < 256
    return out[:nbytes].tobytes()


def _big_frame() -> bytes:
    """What the fuzz found: a 7.8 kB frame of four 4096 x 4096 context-coded tensors,
    each with a valid section and 1,800 8-bit codes. It decodes, within every count
    limit (``max_context_numel`` is exactly their 2**26 elements), in about 0.9 s of
    CPU (1.8 s wall on a loaded 2-core machine): four times 2**24 coder steps."""
    builder = FrameBuilder()
    for i in range(4):
        builder.add(
            name=f"w{i}",
            shape=BIG,
            mode=0,
            count=len(BIG_KEPT),
            coding=5,
            index=_big_section(),
            scheme=4,
            bits=8,
            codes=bytes(len(BIG_KEPT)),
        )
    return builder.build()


def test_a_small_frame_cannot_declare_large_context_coded_tensors() -> None:
    payload = _big_frame()
    assert len(payload) < 8_000
    assert 4 * int(np.prod(BIG)) == DEFAULT_LIMITS.max_context_numel
    # Well formed and within every other limit: only the work bound refuses it.
    unbounded = FrameLimits(max_context_numel_per_byte=1 << 30)
    assert len(inspect_frame(payload, limits=unbounded)[1]) == 4
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(LimitExceeded, match="max_context_numel_per_byte") as info:
            decode_frame(payload)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.tensor == "#0 'w0'"
    per_byte = DEFAULT_LIMITS.max_context_numel_per_byte
    assert info.value.expected == f">= {int(np.prod(BIG)) // per_byte}"
    # Refused on the table, before any section is decoded: a fraction of a
    # millisecond when measured (under load), nothing allocated beyond the frame.
    assert elapsed < 0.2, elapsed
    assert peak < 1 << 20, peak


def test_the_encoder_writes_no_section_the_decoder_refuses() -> None:
    # 854 positions in the first two rows of 1024 x 1024: the context coder would need
    # fewer bytes than one per max_context_numel_per_byte elements, so the encoder
    # codes them another way (and refuses the context coding when it is forced).
    shape = (1024, 1024)
    numel = int(np.prod(shape))
    kept = np.concatenate([np.arange(0, 1024, 2), np.arange(1024, 2048, 3)]).astype(np.int64)
    plan = choose_index_coding(kept, numel, shape=shape)
    assert plan.coding != "context"
    assert "context" not in index_bits_for(kept, numel, shape=shape)
    with pytest.raises(ValueError, match="cannot carry"):
        choose_index_coding(kept, numel, coding="context", shape=shape)
    (tensor,) = decode_frame(encode_frame("c", [_tensor(shape, kept)]))[1]
    np.testing.assert_array_equal(tensor.indices, kept)
    # Without the bound the coder would have won, with a section it cannot have.
    out = np.zeros(1 << 12, np.uint8)
    nbytes = int(context_encode(kept, shape[0], shape[1], out))
    least = context_min_nbytes(numel)
    assert least is not None
    assert 0 < nbytes < min(least, plan.nbytes)
