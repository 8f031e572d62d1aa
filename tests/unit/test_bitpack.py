"""Bit packing: the kernels against numpy's own little-endian bit packing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.kernels.bitpack import MAX_WIDTH, pack_bits, packed_nbytes, unpack_bits


def _reference_pack(values: np.ndarray, width: int) -> np.ndarray:
    """Bit ``j`` of value ``i`` at stream bit ``i * width + j``, via numpy."""
    shifts = np.arange(width, dtype=np.uint64)
    bits = ((values.astype(np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bits.ravel(), bitorder="little")


@settings(max_examples=300, deadline=None)
@given(
    width=st.integers(1, MAX_WIDTH),
    count=st.integers(0, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_pack_matches_reference_and_round_trips(width: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 << width, count, dtype=np.uint64, endpoint=False)
    packed = pack_bits(values, width)
    assert packed.dtype == np.uint8
    assert packed.shape == (packed_nbytes(count, width),)
    np.testing.assert_array_equal(packed, _reference_pack(values, width))
    np.testing.assert_array_equal(unpack_bits(packed, count, width, np.uint64), values)


@pytest.mark.parametrize(
    ("width", "dtype"),
    [
        (width, dtype)
        for width in (8, 16, 32)
        for dtype in (np.uint8, np.uint16, np.uint32, np.uint64)
        if np.dtype(dtype).itemsize * 8 >= width
    ],
)
def test_byte_aligned_widths_take_any_wide_enough_dtype(width: int, dtype: type) -> None:
    values: np.ndarray = (np.arange(1000, dtype=np.uint64) * 2654435761 % (1 << width)).astype(
        dtype
    )
    packed = pack_bits(values, width)
    np.testing.assert_array_equal(packed, _reference_pack(values, width))
    out = unpack_bits(packed, 1000, width, dtype)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, values)


def test_final_byte_padding_is_zero() -> None:
    packed = pack_bits(np.array([7, 7, 7], dtype=np.uint8), 3)  # 9 bits
    assert packed.tolist() == [0xFF, 0x01]


@pytest.mark.parametrize("width", [0, MAX_WIDTH + 1, -1])
def test_width_out_of_range_is_rejected(width: int) -> None:
    with pytest.raises(ValueError, match="bit width"):
        pack_bits(np.zeros(3, np.uint8), width)
    with pytest.raises(ValueError, match="bit width"):
        unpack_bits(np.zeros(8, np.uint8), 3, width, np.uint64)


def test_unpack_checks_buffer_size_dtype_and_count() -> None:
    with pytest.raises(ValueError, match="at least 2 bytes"):
        unpack_bits(np.zeros(1, np.uint8), 3, 5, np.uint8)
    with pytest.raises(ValueError, match="cannot hold"):
        unpack_bits(np.zeros(8, np.uint8), 3, 12, np.uint8)
    with pytest.raises(ValueError, match="non-negative"):
        unpack_bits(np.zeros(8, np.uint8), -1, 3, np.uint8)


def test_pack_rejects_signed_and_multidimensional_input() -> None:
    with pytest.raises(ValueError, match="unsigned"):
        pack_bits(np.zeros(3, np.int64), 3)
    with pytest.raises(ValueError, match="one-dimensional"):
        pack_bits(np.zeros((2, 2), np.uint8), 3)
