"""Every decoder error class, each from a frame that lies about one thing.

Frames are written field by field with :class:`~fedsync.wire.testing.FrameBuilder`
and, unless the test is about the envelope, carry a correct length and CRC, so the
check under test is the one that has to fire.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import (
    BadMagic,
    ChecksumMismatch,
    CountMismatch,
    FrameLimits,
    IndexOutOfRange,
    LimitExceeded,
    MalformedField,
    PayloadError,
    TrailingBytes,
    TruncatedPayload,
    UnknownCode,
    UnorderedIndices,
    UnsupportedVersion,
    decode_frame,
    encode_frame,
)
from fedsync.wire.testing import FrameBuilder, reseal


def _raises(
    payload: bytes, error: type[PayloadError], *parts: str, limits: FrameLimits | None = None
) -> PayloadError:
    """Decode ``payload``; check the error class and that the message has every part."""
    with pytest.raises(error) as info:
        if limits is None:
            decode_frame(payload)
        else:
            decode_frame(payload, limits=limits)
    message = str(info.value)
    for part in parts:
        assert part in message, (part, message)
    assert isinstance(info.value, ValueError)
    return info.value


def _frame(**fields: Any) -> bytes:
    return FrameBuilder().add(**fields).build()


def test_the_default_raw_tensor_is_valid() -> None:
    codec, (tensor,) = decode_frame(_frame())
    assert codec == "test"
    assert tensor.spec == TensorSpec("t", (4,), "float32")
    assert tensor.values.codes.tolist() == [1, 2, 3, 4]


def test_error_carries_structured_fields() -> None:
    error = _raises(_frame(bits=0), MalformedField)
    assert error.field == "bits"
    assert error.tensor == "format #0"
    assert error.expected == "1..32"
    assert error.got == 0
    assert (
        str(error)
        == "tensor format #0, field 'bits': bits per code out of range (expected 1..32, got 0)"
    )


# --------------------------------------------------------------------------------------
# Envelope: magic, version, length, checksum, flags
# --------------------------------------------------------------------------------------


def test_bad_magic() -> None:
    frame = FrameBuilder(magic=b"GIF8").add().build()
    _raises(
        frame, BadMagic, "field 'magic'", "not a fedsync frame", "expected b'FSYN', got b'GIF8'"
    )
    _raises(b"PK", BadMagic, "got b'PK'")
    _raises(b"", TruncatedPayload, "shorter than an empty frame")


def test_unsupported_version() -> None:
    for version in (1, 3):
        frame = FrameBuilder(version=version).add().build()
        _raises(frame, UnsupportedVersion, "field 'version'", f"expected 2, got {version}")


def test_truncated_envelope() -> None:
    frame = _frame()
    _raises(frame[:10], TruncatedPayload, "field 'header'", "got 10")
    _raises(frame[:-1], TruncatedPayload, "field 'length'", f"expected {len(frame)} bytes")


def test_trailing_bytes_after_the_frame() -> None:
    frame = _frame()
    _raises(frame + b"\x00", TrailingBytes, "field 'length'", f"got {len(frame) + 1} bytes")


def test_checksum_mismatch() -> None:
    frame = FrameBuilder().add().build(crc=0)
    _raises(frame, ChecksumMismatch, "field 'crc32'", "got 0x00000000")
    flipped = bytearray(_frame())
    flipped[20] ^= 0x04
    _raises(bytes(flipped), ChecksumMismatch, "CRC-32")


def test_reserved_flags() -> None:
    # Bits 0 (table) and 1 (seed) are defined; any other is refused before the body.
    for flags in (0x04, 0x05, 0x07, 0x80):
        frame = FrameBuilder(flags=flags).add().build()
        _raises(frame, MalformedField, "field 'flags'", f"got {flags:#04x}")


def test_frame_seed_travels_once_and_comes_back_on_every_tensor() -> None:
    frame = FrameBuilder(seed=(1 << 64) - 2).add().add(name="u").build()
    _, tensors = decode_frame(frame)
    assert [t.seed for t in tensors] == [(1 << 64) - 2] * 2
    assert len(frame) == len(FrameBuilder().add().add(name="u").build()) + 8
    assert all(t.seed is None for t in decode_frame(_frame())[1])


def test_frame_seed_cut_short() -> None:
    # The seed flag set but fewer than 8 bytes before the end: the read names the seed.
    frame = FrameBuilder(codec="c", seed=b"\x01\x02\x03").build(tensor_count=0, format_count=0)
    _raises(frame, TruncatedPayload, "field 'seed'")


# --------------------------------------------------------------------------------------
# Limits (checked before allocating)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "limits", "parts"),
    [
        (_frame(), FrameLimits(max_payload_bytes=10), ["field 'payload'", "<= 10 bytes"]),
        (FrameBuilder().add().add(name="u").build(), FrameLimits(max_tensors=1), ["tensor count"]),
        (_frame(shape=(5, 5)), FrameLimits(max_numel=24), ["field 'shape'", "25 (shape (5, 5))"]),
        (_frame(shape=(0, 99)), FrameLimits(max_numel=24), ["field 'shape[1]'", "got 99"]),
        (_frame(shape=(1, 1, 4)), FrameLimits(max_ndim=2), ["field 'ndim'", "got 3"]),
        (_frame(name="x" * 9), FrameLimits(max_name_length=8), ["max_name_length", "got 9"]),
        (
            FrameBuilder(codec="abc").add().build(),
            FrameLimits(max_codec_length=2),
            ["codec length"],
        ),
        (
            _frame(params=[("a", 0), ("b", 0)]),
            FrameLimits(max_params=1),
            ["field 'param count'", "got 2"],
        ),
        (
            FrameBuilder().add().add(name="u").build(),
            FrameLimits(max_total_values=7),
            ["tensor #1 'u'", "<= 7 in all", "8 so far"],
        ),
    ],
)
def test_limit_exceeded(frame: bytes, limits: FrameLimits, parts: list[str]) -> None:
    _raises(frame, LimitExceeded, *parts, limits=limits)


def test_frame_limits_validate_themselves() -> None:
    with pytest.raises(ValueError, match="max_tensors must be a non-negative int"):
        FrameLimits(max_tensors=-1)
    with pytest.raises(ValueError, match="max_context_numel_per_byte must be a non-negative"):
        FrameLimits(max_context_numel_per_byte=-1)
    with pytest.raises(ValueError, match=r"max_numel must be at most"):
        FrameLimits(max_numel=1 << 60)
    with pytest.raises(ValueError, match="max_ndim must be at most 255"):
        FrameLimits(max_ndim=300)


# --------------------------------------------------------------------------------------
# Malformed fields and unknown codes
# --------------------------------------------------------------------------------------


def test_non_minimal_and_overlong_varints() -> None:
    frame = bytearray(_frame())
    # The codec length is the first body byte (0x04); spell it 0x84 0x00 instead.
    non_minimal = reseal(bytes(frame[:14]) + b"\x84\x00" + bytes(frame[15:]))
    _raises(non_minimal, MalformedField, "field 'codec length'", "not minimal")
    overlong = reseal(bytes(frame[:14]) + b"\xff" * 11 + bytes(frame[14:]))
    _raises(overlong, MalformedField, "runs past 10 bytes")
    too_big = reseal(bytes(frame[:14]) + b"\xff" * 9 + b"\x7f" + bytes(frame[15:]))
    _raises(too_big, MalformedField, "exceeds 64 bits")


def test_bad_utf8() -> None:
    _raises(_frame(name=b"\xff\xfe"), MalformedField, "tensor #0, field 'name'", "not valid UTF-8")
    _raises(FrameBuilder(codec=b"\xc3").add().build(), MalformedField, "field 'codec'", "UTF-8")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dtype": 0}, "dtype"),
        ({"dtype": 9}, "dtype"),
        ({"mode": 4}, "index mode"),
        ({"scheme": 0}, "scheme"),
        ({"scheme": 200}, "scheme"),
        ({"coding": 9}, "index coding"),
    ],
)
def test_unknown_codes(fields: dict[str, int], field: str) -> None:
    error = _raises(_frame(**fields), UnknownCode, f"field '{field}'", "unknown")
    assert isinstance(error, MalformedField)


@pytest.mark.parametrize("bits", [0, 33, 255])
def test_bits_outside_1_to_32(bits: int) -> None:
    _raises(_frame(bits=bits), MalformedField, "field 'bits'", f"got {bits}")


def test_duplicate_names() -> None:
    frame = FrameBuilder().add().add().build()
    _raises(frame, MalformedField, "tensor #1 't'", "duplicate tensor name")
    params = _frame(params=[("s", 0), ("s", 0)])
    _raises(params, MalformedField, "duplicate param name 's'")


@pytest.mark.parametrize(
    ("fields", "parts"),
    [
        ({"mode": 0, "count": 1, "codes": b"\x01", "coding": 0}, ["needs a position coding"]),
        ({"coding": 2, "index": b"\x0f"}, ["index mode 'dense' needs 'none'"]),
        (
            {
                "mode": 0,
                "count": 1,
                "codes": b"\x01",
                "coding": 4,
                "coding_param": 3,
                "index": b"\x01",
            },
            ["field 'coding param'", "expected <= 2, got 3"],
        ),
        (
            {"mode": 0, "count": 1, "codes": b"\x01", "coding": 4, "index": b"\x01\x00"},
            ["field 'index bytes'", "Rice section size impossible", "expected 1..1, got 2"],
        ),
        ({"bits": 3, "codes": b"\xff\xff"}, ["field 'codes'", "padding bits"]),
    ],
)
def test_malformed_index_fields(fields: dict[str, object], parts: list[str]) -> None:
    _raises(_frame(**fields), MalformedField, *parts)


# --------------------------------------------------------------------------------------
# Counts, truncation and trailing bytes inside a resealed frame
# --------------------------------------------------------------------------------------


def test_sections_of_implied_size_must_have_it() -> None:
    # Bitmap and Elias-Fano sizes follow from count and numel; a section longer
    # than that leaves bytes the table does not account for.
    for fields, implied in (
        ({"mode": 0, "coding": 2, "index": b"\x0f\x00"}, 5),
        ({"mode": 0, "count": 1, "codes": b"\x01", "coding": 3, "index": b"\x01\x00"}, 2),
    ):
        _raises(
            _frame(**fields),
            TrailingBytes,
            "field 'data'",
            f"expected {implied} bytes, got {implied + 1}",
        )
    # A dense tensor's count is its numel: three codes for four elements are short.
    _raises(_frame(count=3, codes=b"\x01\x02\x03"), TruncatedPayload, "expected 4 bytes")


def test_count_mismatches() -> None:
    _raises(
        _frame(mode=2, count=5, codes=bytes(5)),
        CountMismatch,
        "more values than the tensor has",
        "got 5",
    )
    _raises(
        _frame(mode=0, count=3, codes=bytes(3), coding=1),
        CountMismatch,
        "dense coding needs every position",
    )


def test_truncated_and_trailing_data_part() -> None:
    _raises(
        _frame(codes=b"\x01\x02"), TruncatedPayload, "field 'data'", "expected 4 bytes, got 2 bytes"
    )
    frame = FrameBuilder().add().build(extra_body=b"\x00")
    _raises(frame, TrailingBytes, "field 'data'", "expected 4 bytes, got 5 bytes")
    # A param whose declared length cannot fit the frame fails as soon as it is read.
    _raises(_frame(params=[("s", 1 << 40)]), TruncatedPayload, "field \"param 's' length\"")


def test_truncated_table() -> None:
    frame = FrameBuilder().add().build(tensor_count=2)
    # The second entry's fields run into the data part and then off its end.
    _raises(frame, PayloadError, "tensor #1")


# --------------------------------------------------------------------------------------
# Positions: out of range and unordered, in full frames
# --------------------------------------------------------------------------------------


def _explicit(
    index: bytes, coding: int, param: int, count: int, shape: tuple[int, ...] = (16,)
) -> bytes:
    return _frame(
        mode=0,
        shape=shape,
        count=count,
        codes=bytes(count),
        coding=coding,
        coding_param=param,
        index=index,
    )


def test_index_out_of_range_in_a_frame() -> None:
    # Bitmap of 10 elements (2 bytes): padding bit 12 set.
    _raises(
        _explicit(bytes([0x01, 0x10]), 2, 0, 2, (10,)),
        IndexOutOfRange,
        "tensor #0 't'",
        "field 'index section (bitmap)'",
        "bitmap padding bit 12 is set",
    )
    # Rice k=0 in a 16-element tensor: a unary run of 16+ zeros means a gap >= 16.
    _raises(
        _explicit(bytes(2), 4, 0, 1), IndexOutOfRange, "decodes to at least 16", "outside [0, 16)"
    )
    # A longer stream is already refused by its size: 1 position costs at most 16 bits.
    _raises(_explicit(bytes(3), 4, 0, 1), MalformedField, "Rice section size impossible", "1..2")


def test_duplicate_and_decreasing_indices_in_a_frame() -> None:
    # Elias-Fano, numel 16, L = 2: lows (1, 1), high bits 1 and 2 -> positions 5, 5.
    low = bytes([0b0101])
    high = bytes([0b0110])
    _raises(_explicit(low + high, 3, 2, 2), UnorderedIndices, "position #1 = 5 does not exceed")


def test_hand_built_elias_fano_frame_matches_the_encoder() -> None:
    # numel 16, L = 2: positions 5 = (1, 1) and 6 = (1, 2); lows 0b10_01, high bits 1, 2.
    frame = _explicit(bytes([0b1001]) + bytes([0b0110]), 3, 2, 2)
    tensor = CompressedTensor(
        TensorSpec("t", (16,)),
        "explicit",
        np.array([5, 6]),
        QuantizedValues("uniform", 8, np.zeros(2, np.uint8)),
    )
    _, (got,) = decode_frame(frame)
    assert got.indices is not None and got.indices.tolist() == [5, 6]
    assert encode_frame("test", [tensor], index_coding="elias_fano") == frame


def test_struct_error_never_leaks_from_short_headers() -> None:
    for size in range(0, 18):
        payload = b"FSYN" + bytes([1, 0]) + struct.pack("<Q", size) + bytes(max(0, size - 14))
        with pytest.raises(PayloadError):
            decode_frame(payload[:size])
