"""Index codings: byte-exact layouts, exact sizes, optimal parameters, hostile input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels import index_coding as kern
from fedsync.wire import (
    CountMismatch,
    IndexOutOfRange,
    MalformedField,
    TruncatedPayload,
    UnorderedIndices,
    index_bits_for,
)
from fedsync.wire.buffer import varint_len
from fedsync.wire.index_coding import (
    IndexPlan,
    as_index_array,
    choose_index_coding,
    decode_indices,
    ef_nbytes,
    encode_indices,
    index_candidates,
    max_param,
    rice_nbytes_bounds,
)

# --------------------------------------------------------------------------------------
# Independent reference encoders, one bit at a time, straight from the definitions.
# --------------------------------------------------------------------------------------


def _pack(bits: list[int]) -> bytes:
    return np.packbits(np.array(bits, dtype=np.uint8), bitorder="little").tobytes()


def ref_bitmap(indices: np.ndarray, numel: int) -> bytes:
    bits = [0] * numel
    for x in indices:
        bits[x] = 1
    return _pack(bits)


def ref_rice(indices: np.ndarray, k: int) -> bytes:
    bits: list[int] = []
    prev = -1
    for x in indices.tolist():
        gap = x - prev - 1
        prev = x
        bits += [0] * (gap >> k) + [1] + [(gap >> j) & 1 for j in range(k)]
    return _pack(bits)


def ref_elias_fano(indices: np.ndarray, numel: int, low_bits: int) -> bytes:
    n = len(indices)
    if n == 0:
        return b""
    low = [(x >> j) & 1 for x in indices.tolist() for j in range(low_bits)]
    high = [0] * (n + ((numel - 1) >> low_bits))
    for i, x in enumerate(indices.tolist()):
        high[(x >> low_bits) + i] = 1
    return _pack(low) + _pack(high)


def reference(indices: np.ndarray, numel: int, plan: IndexPlan) -> bytes:
    if plan.coding == "dense":
        return b""
    if plan.coding == "bitmap":
        return ref_bitmap(indices, numel)
    if plan.coding == "rice":
        return ref_rice(indices, plan.param)
    return ref_elias_fano(indices, numel, plan.param)


@st.composite
def index_sets(draw: st.DrawFn, max_numel: int = 3000) -> tuple[np.ndarray, int]:
    """Random supports (uniform or clustered runs) at any density, numel 0 included."""
    numel = draw(st.integers(0, max_numel))
    density = draw(st.sampled_from([0.0, 1.0, None]))
    if density is None:
        density = draw(st.floats(0.0, 1.0))
    count = round(density * numel)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()) or count == 0:
        chosen = rng.choice(numel, count, replace=False)
    else:  # clustered: runs of consecutive positions
        starts = rng.choice(numel, max(1, count // 8), replace=False)
        chosen = np.unique(np.clip(starts[:, None] + np.arange(8), 0, numel - 1))[:count]
    return np.sort(chosen).astype(np.int64), numel


# --------------------------------------------------------------------------------------
# Round trips, exact sizes, byte-exact layouts.
# --------------------------------------------------------------------------------------


@settings(max_examples=250, deadline=None)
@given(index_sets())
def test_every_candidate_is_byte_exact_and_round_trips(case: tuple[np.ndarray, int]) -> None:
    indices, numel = case
    for plan in index_candidates(indices, numel, context="always"):
        section = encode_indices(indices, numel, plan)
        assert len(section) == plan.nbytes, plan
        if plan.coding != "context":  # its own tests below check it
            assert section == reference(indices, numel, plan), plan
        decoded = decode_indices(
            np.frombuffer(section, np.uint8),
            plan.coding,
            plan.param,
            len(indices),
            numel,
            tensor="t",
        )
        np.testing.assert_array_equal(decoded, indices)
        assert decoded.dtype == np.int64


@settings(max_examples=150, deadline=None)
@given(index_sets())
def test_choice_is_the_smallest_candidate(case: tuple[np.ndarray, int]) -> None:
    indices, numel = case
    bits = index_bits_for(indices, numel)
    chosen = choose_index_coding(indices, numel)
    assert chosen.frame_bits == min(p.frame_bits for p in index_candidates(indices, numel))
    assert chosen.frame_bits >= min(bits.values())  # "always" may add the context coding
    assert bits[chosen.coding] == chosen.frame_bits
    assert ("dense" in bits) == (len(indices) == numel)
    for plan in index_candidates(indices, numel, context="always"):
        table = (plan.coding in ("elias_fano", "rice")) + (
            varint_len(plan.nbytes) if plan.coding in ("rice", "context") else 0
        )
        assert plan.frame_bits == 8 * (table + plan.nbytes)


@settings(max_examples=150, deadline=None)
@given(index_sets())
def test_rice_and_elias_fano_parameters_are_global_optima(case: tuple[np.ndarray, int]) -> None:
    indices, numel = case
    plans = {plan.coding: plan for plan in index_candidates(indices, numel)}
    n = len(indices)
    rice_bits = [
        n * (k + 1) + sum((int(g) >> k) for g in np.diff(indices, prepend=-1) - 1)
        for k in range(max_param(numel) + 1)
    ]
    assert plans["rice"].nbytes == (min(rice_bits) + 7) // 8
    ef = [ef_nbytes(n, numel, low_bits) for low_bits in range(max_param(numel) + 1)]
    assert plans["elias_fano"].nbytes == min(ef)
    assert plans["elias_fano"].param == ef.index(min(ef))


def _entropy_bits_per_value(density: float) -> float:
    h = -density * math.log2(density) - (1 - density) * math.log2(1 - density)
    return h / density


@pytest.mark.parametrize("density", [0.001, 0.003, 0.01, 0.03, 0.1])
def test_random_supports_code_within_ten_percent_of_entropy(density: float) -> None:
    numel = 2_000_000
    rng = np.random.default_rng(7)
    indices = np.sort(rng.choice(numel, int(density * numel), replace=False))
    bits = index_bits_for(indices, numel)
    bound = _entropy_bits_per_value(density)
    best = min(bits.values()) / len(indices)
    assert best <= 1.10 * bound, (bits, bound)
    # Rice with the optimal k is the winner on geometric gaps, within ~2% here;
    # Elias-Fano stays near its 2 + log2(1 / density) bits.
    assert bits["rice"] / len(indices) <= 1.03 * bound
    assert bits["elias_fano"] / len(indices) <= 2 + math.ceil(math.log2(1 / density)) + 0.1


def test_dense_coding_is_free_and_chosen_for_full_sets() -> None:
    indices = np.arange(100)
    plan = choose_index_coding(indices, 100)
    assert plan == IndexPlan("dense", 0, 0)
    assert index_bits_for(indices, 100)["dense"] == 0  # its id shares the head byte


def test_bitmap_wins_at_high_density_and_rice_at_low() -> None:
    rng = np.random.default_rng(0)
    # At density 1/2 a random support has one bit of entropy per element: nothing
    # beats the bitmap (at 0.6 the adaptive context coder does, by 3 %).
    dense = np.sort(rng.choice(10_000, 5000, replace=False))
    sparse = np.sort(rng.choice(10_000, 100, replace=False))
    assert choose_index_coding(dense, 10_000).coding == "bitmap"
    assert choose_index_coding(sparse, 10_000).coding == "rice"


def test_forcing_a_coding() -> None:
    indices = np.array([1, 5, 9])
    assert choose_index_coding(indices, 10, coding="elias_fano").coding == "elias_fano"
    with pytest.raises(ValueError, match="cannot carry 3 of 10"):
        choose_index_coding(indices, 10, coding="dense")
    with pytest.raises(ValueError, match="unknown index coding 'golomb'"):
        choose_index_coding(indices, 10, coding="golomb")


# --------------------------------------------------------------------------------------
# Input checks on the encoding side.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([3, 2], r"strictly increasing: #1 = 2 follows 3"),
        ([2, 2], r"strictly increasing: #1 = 2 follows 2"),
        ([-1, 2], r"index #0 = -1 is outside \[0, 10\)"),
        ([2, 10], r"index #1 = 10 is outside \[0, 10\)"),
        ([[1, 2]], r"one-dimensional"),
        ([0.5, 2.0], r"must be integers"),
    ],
)
def test_as_index_array_names_the_bad_position(indices: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        as_index_array(np.array(indices), 10)


def test_as_index_array_accepts_any_integer_dtype() -> None:
    out = as_index_array(np.array([1, 4], dtype=np.uint16), 10)
    assert out.dtype == np.int64
    assert out.tolist() == [1, 4]
    assert as_index_array(np.array([]), 10).shape == (0,)


# --------------------------------------------------------------------------------------
# Decoding hostile sections (the table checks in the frame decoder come first; here
# the section has the declared size but lies about its contents).
# --------------------------------------------------------------------------------------


def _decode(section: bytes, coding: str, param: int, count: int, numel: int) -> np.ndarray:
    return decode_indices(
        np.frombuffer(section, np.uint8), coding, param, count, numel, tensor="#0 'w'"
    )


def test_rice_unary_run_that_never_ends_stops_at_the_section_end() -> None:
    numel = 1 << 40
    _, most = rice_nbytes_bounds(2, numel, 0)
    assert most >= 4096
    with pytest.raises(TruncatedPayload, match=r"tensor #0 'w'.*stream ends after 0 of 2"):
        _decode(bytes(4096), "rice", 0, 2, numel)


def test_rice_unary_run_past_numel_stops_at_once() -> None:
    with pytest.raises(IndexOutOfRange, match=r"position #0 decodes to at least 100"):
        _decode(bytes(64), "rice", 0, 1, 100)


def test_rice_position_out_of_range() -> None:
    # k = 3, gap 15 for a 10-element tensor: quotient 1 (0b01), remainder 0b111.
    section = ref_rice(np.array([15]), 3)
    with pytest.raises(IndexOutOfRange, match=r"position #0 decodes to at least 15"):
        _decode(section, "rice", 3, 1, 10)


def test_rice_rejects_a_spare_byte_and_nonzero_padding() -> None:
    section = ref_rice(np.array([1, 2]), 0)  # 3 bits: 0 1 1
    with pytest.raises(MalformedField, match="shorter than its declared section"):
        _decode(section + b"\x00", "rice", 0, 2, 10)
    with pytest.raises(MalformedField, match="padding bits"):
        _decode(bytes([section[0] | 0x80]), "rice", 0, 2, 10)


def test_bitmap_faults() -> None:
    with pytest.raises(IndexOutOfRange, match="bitmap padding bit 11 is set"):
        _decode(bytes([0b0000_0001, 0b0000_1000]), "bitmap", 0, 2, 10)
    with pytest.raises(CountMismatch, match="beyond the 1 declared positions"):
        _decode(bytes([0b0000_0011, 0]), "bitmap", 0, 1, 10)
    with pytest.raises(TruncatedPayload, match="stream ends after 1 of 3 positions"):
        _decode(bytes([0b0000_0100, 0]), "bitmap", 0, 3, 10)


def _ef_section(lows: list[int], high_positions: list[int], low_bits: int, numel: int) -> bytes:
    n = len(lows)
    low = [(x >> j) & 1 for x in lows for j in range(low_bits)]
    high = [0] * (n + ((numel - 1) >> low_bits))
    for p in high_positions:
        high[p] = 1
    return _pack(low) + _pack(high)


def test_elias_fano_duplicate_and_decreasing_positions() -> None:
    # L = 2, numel 16: both positions have high part 1 and low part 1 -> 5, 5.
    duplicate = _ef_section([1, 1], [1, 2], 2, 16)
    with pytest.raises(UnorderedIndices, match=r"position #1 = 5 does not exceed"):
        _decode(duplicate, "elias_fano", 2, 2, 16)
    decreasing = _ef_section([3, 1], [1, 2], 2, 16)
    with pytest.raises(UnorderedIndices, match=r"position #1 = 5"):
        _decode(decreasing, "elias_fano", 2, 2, 16)


def test_elias_fano_out_of_range_and_bit_count_faults() -> None:
    # numel 10, L = 2: high parts may reach (10 - 1) >> 2 = 2; bit 3 for #0 -> high 3,
    # so the position is at least 3 << 2 = 12.
    with pytest.raises(IndexOutOfRange, match=r"position #0 decodes to at least 12"):
        _decode(_ef_section([0, 0], [3], 2, 10), "elias_fano", 2, 2, 10)
    # high 2, low 3 -> 11 >= 10.
    with pytest.raises(IndexOutOfRange, match=r"decodes to at least 11"):
        _decode(_ef_section([3], [2], 2, 10), "elias_fano", 2, 1, 10)
    with pytest.raises(TruncatedPayload, match="stream ends after 1 of 2"):
        _decode(_ef_section([0, 1], [0], 2, 10), "elias_fano", 2, 2, 10)
    with pytest.raises(CountMismatch, match="beyond the 1 declared"):
        _decode(_ef_section([0], [0, 1], 2, 10), "elias_fano", 2, 1, 10)


def test_kernel_status_values_are_distinct() -> None:
    statuses = {
        kern.STATUS_OK,
        kern.STATUS_TRUNCATED,
        kern.STATUS_OUT_OF_RANGE,
        kern.STATUS_UNORDERED,
        kern.STATUS_EXTRA_BITS,
    }
    assert len(statuses) == 5


@settings(max_examples=200, deadline=None)
@given(
    numel=st.integers(1, 1 << 20),
    count=st.integers(0, 300),
    k=st.integers(0, kern.RICE_WORDS_MAX_K),
    seed=st.integers(0, 2**32 - 1),
)
def test_word_rice_encoder_writes_the_byte_encoders_stream(
    numel: int, count: int, k: int, seed: int
) -> None:
    """The 32-bit-word encoder (the fast path) and the byte encoder agree bit for bit,
    long unary runs (large gaps, small k) included."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, numel, size=count, dtype=np.int64)
    indices = np.unique(picks)
    bits = indices.shape[0] * (k + 1) + int(kern.rice_shift_sum(indices, k))
    nbytes = (bits + 7) // 8
    by_bytes = np.zeros(nbytes, dtype=np.uint8)
    words = np.zeros(-(-nbytes // 4) + 1, dtype=np.uint32)
    assert kern.rice_encode(indices, k, by_bytes) == bits
    assert kern.rice_encode_words(indices, k, words) == bits
    np.testing.assert_array_equal(words.view(np.uint8)[:nbytes], by_bytes)
    assert not words.view(np.uint8)[nbytes:].any()
